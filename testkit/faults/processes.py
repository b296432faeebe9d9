"""Process faults on a replica set's servers: pauses (SIGSTOP/SIGCONT) and kill -9 of
any subset, always by the pid ``ReplicaSet`` recorded for that server.

A paused server runs nothing, timers included, but its kernel still accepts
connections and buffers what peers send it: when it resumes it finds requests
and frames that arrived while it slept, as a process resuming from a long GC
pause or a frozen VM does.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from collections.abc import Iterator, Sequence

from testkit.replicaset import ReplicaSet


def pause(rs: ReplicaSet, name: str) -> float:
    """SIGSTOP ``name``; when it stopped (monotonic)."""
    rs.kill(name, signal.SIGSTOP)
    return time.monotonic()


def resume(rs: ReplicaSet, name: str) -> None:
    rs.kill(name, signal.SIGCONT)


@contextlib.contextmanager
def paused(rs: ReplicaSet, name: str) -> Iterator[float]:
    """``name`` stopped while inside (resumed however the block ends); yields when."""
    at = pause(rs, name)
    try:
        yield at
    finally:
        with contextlib.suppress(RuntimeError):
            resume(rs, name)


def kill9(rs: ReplicaSet, names: Sequence[str]) -> float:
    """kill -9 every server in ``names``, as close together as signals go; when."""
    at = time.monotonic()
    for name in names:
        rs.kill(name, signal.SIGKILL)
    return at


def any_subset(rs: ReplicaSet, size: int, rng: random.Random | None = None) -> list[str]:
    """``size`` server names of the set, chosen at random."""
    return sorted((rng or random).sample([s.name for s in rs.servers], size))
