"""Each test's wall time and CPU, for finding what makes the suite slow (opt-in).

    pytest -p testkit.cpu_timeline -n 2 ...          # appends to cpu-timeline.tsv
    python -m testkit.cpu_timeline cpu-timeline.tsv  # the modules, most CPU first

The suite is bound by the CPU of two cores, so a test's wall time says little about
what it costs the others: a test that waits costs nothing, one that builds an image
costs two workers' time. Each xdist worker (or a run without xdist) writes, per test,
its worker, start and end (setup to teardown), its own CPU and the CPU of the child
processes it reaped meanwhile (the servers a test starts and stops; a module's
fixture's processes count to the test that tore them down). ``CPU_TIMELINE`` names the
file. The controller of an xdist run writes nothing: it only relays the workers'
reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

_started: dict[str, tuple[float, float, float]] = {}
_recording = True  # False in an xdist controller (pytest_configure)


def _cpu() -> tuple[float, float]:
    """This process's CPU and its reaped children's, in seconds."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def runs_tests(config: pytest.Config) -> bool:
    """Whether this process runs tests: an xdist worker, or a run without xdist (an xdist
    controller has ``-n`` and no ``workerinput``)."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_configure(config: pytest.Config) -> None:
    global _recording
    _recording = runs_tests(config)


def pytest_runtest_logstart(nodeid: str) -> None:
    if _recording:
        _started[nodeid] = (time.time(), *_cpu())


def pytest_runtest_logfinish(nodeid: str) -> None:
    began = _started.pop(nodeid, None)
    if began is None:
        return
    start, own, children = began
    own_now, children_now = _cpu()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = (
        f"{worker}\t{start:.1f}\t{time.time():.1f}\t{own_now - own:.2f}\t"
        f"{children_now - children:.2f}\t{nodeid}\n"
    )
    with open(os.environ.get("CPU_TIMELINE", "cpu-timeline.tsv"), "a") as out:
        out.write(line)


@dataclass
class Module:
    wall: float = 0.0
    own: float = 0.0
    children: float = 0.0
    tests: int = 0

    @property
    def cpu(self) -> float:
        return self.own + self.children


def by_module(lines: Iterable[str]) -> dict[str, Module]:
    """Each test module's wall time and CPU, summed over its tests."""
    modules: dict[str, Module] = defaultdict(Module)
    for line in lines:
        _worker, start, end, own, children, nodeid = line.rstrip("\n").split("\t", 5)
        m = modules[nodeid.split("::", 1)[0]]
        m.wall += float(end) - float(start)
        m.own += float(own)
        m.children += float(children)
        m.tests += 1
    return dict(modules)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.cpu_timeline")
    parser.add_argument("file", type=Path, help="what -p testkit.cpu_timeline wrote")
    parser.add_argument("--most", type=int, default=40, help="how many modules")
    args = parser.parse_args(argv)
    modules = by_module(args.file.read_text().splitlines())
    total = sum(m.cpu for m in modules.values())
    print(f"{len(modules)} modules, {total / 60:.1f} CPU minutes")
    print("   cpu s   own s  child s   wall s tests module")
    ranked = sorted(modules.items(), key=lambda kv: -kv[1].cpu)
    for name, m in ranked[: args.most]:
        print(f"{m.cpu:8.1f}{m.own:8.1f}{m.children:9.1f}{m.wall:9.1f}{m.tests:6d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
