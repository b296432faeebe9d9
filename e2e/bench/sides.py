"""Two sides of a workload, each on a server of its own, repeated: the loop the
replicated, archived and workers workloads share.

Each repeat runs every side once, in turn (flipped on every other repeat with
``alternate``, so that a drift of the machine falls on both). A side that fails is
recorded under "<workload>/<side>" and not run again; the others go on. Each run
notes the disk's fdatasync rate just before it, and its server is cleaned up
whatever happened. The medians of each side's runs come back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench import log
from bench.machine import disk_syncs_per_s
from bench.results import Result, merge
from bench.servers import Server

R = TypeVar("R", bound=Result)


def run_sides(
    workload: str,
    sides: tuple[str, ...],
    repeat: int,
    workdir: Path,
    server: Callable[[str], Server],
    measure: Callable[[str, Server], R],
    describe: Callable[[R], str],
    *,
    alternate: bool = False,
) -> tuple[dict[str, R], dict[str, str]]:
    """``server(side)`` makes a side's server (not started); ``measure(side, srv)``
    starts it and measures; ``describe(result)`` is logged after each run."""
    runs_by: dict[str, list[R]] = {}
    errors: dict[str, str] = {}
    for i in range(repeat):
        for side in sides[::-1] if alternate and i % 2 else sides:
            key = f"{workload}/{side}"
            if key in errors:
                continue
            srv = server(side)
            log(f"{workload}: {side}")
            try:
                disk = disk_syncs_per_s(workdir, 0.25)
                res = measure(side, srv)
                res.disk_fdatasync_per_s = disk
                runs_by.setdefault(side, []).append(res)
                log(f"{workload}: {side}: {describe(res)}")
            except Exception as exc:
                errors[key] = f"{type(exc).__name__}: {exc}"
                log(f"{workload}: {side} FAILED: {exc}\n{srv.log_tail()}")
            finally:
                srv.cleanup()
    return {side: merge(r) for side, r in runs_by.items()}, errors
