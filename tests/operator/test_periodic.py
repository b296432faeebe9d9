"""Issue 25: the operator's periodic scheduler (stream_operator.controllers.periodic) on real threads.

One object whose round hangs holds one worker: the others keep their rounds coming;
the hung object is never taken by a second worker; a worker on one object for longer
than ``stall_after`` makes ``alive`` false (``/healthz`` fails on it), and the scheduler
is alive again once that round ends.
"""

from __future__ import annotations

import contextvars
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from stream_operator.controllers.periodic import Periodic
from testkit import wait_for

WHO = contextvars.ContextVar("who", default="nobody")


class Rounds:
    """The work: counts rounds per object, records overlaps, and hangs ``slow`` on ``gate``."""

    def __init__(self) -> None:
        self.rounds: Counter[str] = Counter()
        self.resyncs: Counter[str] = Counter()
        self.contexts: dict[str, str] = {}
        self.overlaps: list[str] = []
        self.gate = threading.Event()
        self.slow_entered = threading.Event()
        self._on: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, namespace: str, name: str, resync: bool) -> None:
        with self._lock:
            if name in self._on:
                self.overlaps.append(name)
            self._on.add(name)
            self.contexts[name] = WHO.get()
        try:
            if name == "slow":
                self.slow_entered.set()
                self.gate.wait()
        finally:
            with self._lock:
                self._on.discard(name)
                self.rounds[name] += 1
                self.resyncs[name] += resync


@pytest.fixture
def rounds() -> Iterator[tuple[Periodic, Rounds]]:
    work = Rounds()
    periodic = Periodic(work, workers=3, stall_after=0.5)
    periodic.start(interval=0.02, resync=0.2)
    try:
        yield periodic, work
    finally:
        work.gate.set()
        periodic.stop(wait=10)


def test_a_hung_object_holds_one_worker_and_the_others_go_on(rounds):
    periodic, work = rounds
    for name in ("slow", "a", "b"):
        WHO.set(f"event of {name}")
        periodic.track("ns", name)
    assert work.slow_entered.wait(10)
    before = dict(work.rounds)
    # Many rounds of a and b while slow's first one hangs, none of them on top of another.
    wait_for(
        lambda: all(work.rounds[n] >= before.get(n, 0) + 20 for n in ("a", "b")),
        message=lambda: f"rounds of a and b while slow hangs: {dict(work.rounds)}",
    )
    assert work.rounds["slow"] == 0
    assert work.overlaps == []
    # Each object's round runs in the context of its own last event.
    assert work.contexts == {n: f"event of {n}" for n in ("slow", "a", "b")}
    # Resyncs come due on their own schedule, between status refreshes.
    wait_for(lambda: work.resyncs["a"] >= 2, message="a resynced")
    assert work.resyncs["a"] < work.rounds["a"]


def test_a_stuck_worker_makes_the_scheduler_unhealthy_until_its_round_ends(rounds):
    periodic, work = rounds
    periodic.track("ns", "a")
    wait_for(lambda: work.rounds["a"] >= 3, message="rounds of a")
    assert periodic.alive()
    periodic.track("ns", "slow")
    assert work.slow_entered.wait(10)
    wait_for(lambda: not periodic.alive(), message="unhealthy while slow's round hangs")
    assert [key for key, _ in periodic.stalled()] == [("ns", "slow")]
    work.gate.set()
    wait_for(lambda: work.rounds["slow"] >= 1, message="slow's round ended")
    wait_for(periodic.alive, message="healthy again")
    assert periodic.stalled() == []
    # slow goes on with its rounds, and never two at once.
    wait_for(lambda: work.rounds["slow"] >= 5, message="more rounds of slow")
    assert work.overlaps == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_forgotten_object_has_no_more_rounds_and_a_worker_that_died_is_unhealthy():
    work = Rounds()

    def rounds_or_die(namespace: str, name: str, resync: bool) -> None:
        if name == "die":
            raise SystemExit("a bug that ends the worker thread")
        work(namespace, name, resync)

    periodic = Periodic(rounds_or_die, workers=1, stall_after=60)
    periodic.start(interval=0.02, resync=60)
    try:
        periodic.track("ns", "a")
        wait_for(lambda: work.rounds["a"] >= 2, message="rounds of a")
        periodic.forget("ns", "a")
        periodic.track("ns", "b")
        # One worker: once b had a round, a round of a under way when it was forgotten ended.
        wait_for(lambda: work.rounds["b"] >= 1, message="a round of b")
        done = work.rounds["a"]
        wait_for(lambda: work.rounds["b"] >= 4, message="rounds of b")
        assert work.rounds["a"] == done
        assert periodic.alive()
        periodic.track("ns", "die")
        wait_for(lambda: not periodic.alive(), message="unhealthy: its worker is gone")
    finally:
        periodic.stop(wait=10)
    assert periodic.alive()  # stopped: nothing is expected of it
