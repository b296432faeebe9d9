"""The operator's periodic work, per object: a small pool of worker threads over the
DurableStreams an event handler keeps track of.

Each object is scheduled on its own: it is due ``interval`` seconds after its last round
ended, a free worker takes the object due first, and an object already being worked on
is never taken by another worker. So one object whose round hangs (a switchover call
that gets no answer, an API request held up) holds one worker, and the other objects'
status and role labels keep their pace on the others; one round after another on a
single thread made every object wait for the slowest.

Every call a round makes has a timeout (the API client's, the switchover call's), so a
round ends by itself. A worker still on one object ``stall_after`` seconds after it
took it (far longer than those timeouts allow) is stuck; ``alive`` says so, and so does
it when a worker thread died, and ``/healthz`` fails on it: the kubelet restarts the
operator, as it would a blocked event loop.

Not kopf timers: kopf puts its finalizer on every object that has one, and a finalizer
nobody removes (the operator uninstalled) makes ``kubectl delete`` hang.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Key = tuple[str, str]  # (namespace, name)
# (namespace, name, resync): resync is True when the object's last whole reconcile is
# ``resync`` seconds old or older, else the round is a status refresh.
Work = Callable[[str, str, bool], None]

log = logging.getLogger("stream_operator.controllers.periodic")


@dataclass
class _Entry:
    # Each object's work runs in the context of its last kopf event, as its handlers
    # do, so whatever kopf keeps in context variables (its settings) is the same in both.
    context: contextvars.Context
    due: float  # when its next round may start
    converged: float  # when it was last reconciled whole


class Periodic:
    """Rounds of ``work`` for every tracked object, each object on its own schedule."""

    def __init__(
        self,
        work: Work,
        *,
        workers: int = 4,
        stall_after: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.work = work
        self.workers = workers
        self.stall_after = stall_after
        self.clock = clock
        self.interval = 5.0
        self.resync = 60.0
        self._objects: dict[Key, _Entry] = {}
        self._running: dict[Key, float] = {}  # object -> when a worker took it
        self._cond = threading.Condition()
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # -- called from the event handlers ------------------------------------------------

    def track(self, namespace: str, name: str) -> None:
        """From the object's event handler: its context is kept for its rounds."""
        key, now = (namespace, name), self.clock()
        with self._cond:
            entry = self._objects.get(key)
            if entry is None:
                self._objects[key] = _Entry(contextvars.copy_context(), now + self.interval, now)
                self._cond.notify()
            else:
                entry.context = contextvars.copy_context()

    def forget(self, namespace: str, name: str) -> None:
        with self._cond:
            self._objects.pop((namespace, name), None)

    def converged(self, namespace: str, name: str) -> None:
        """The object was just reconciled whole: its next resync is ``resync`` from now."""
        with self._cond:
            entry = self._objects.get((namespace, name))
            if entry is not None:
                entry.converged = self.clock()

    def due(self, namespace: str, name: str) -> None:
        """Reconcile the object whole in its next round, not at its next resync (a scale-up
        that waited for a deletion goes on at once)."""
        with self._cond:
            entry = self._objects.get((namespace, name))
            if entry is not None:
                entry.converged = float("-inf")

    # -- life ----------------------------------------------------------------------------

    def start(
        self,
        interval: float,
        resync: float,
        stall_after: float | None = None,
        *,
        workers: int | None = None,
    ) -> None:
        """Start afresh: kopf lists the objects again and ``track`` sees each of them.
        ``interval``: between one object's rounds; ``resync``: between its whole
        reconciles; ``stall_after`` and ``workers``: when given, replace the ones it was
        made with."""
        with self._cond:
            self._objects.clear()
            self._running.clear()
            self._stopping = False
            self.interval, self.resync = interval, resync
            if stall_after is not None:
                self.stall_after = stall_after
            if workers is not None:
                self.workers = workers
        self._threads = [
            threading.Thread(target=self._serve, daemon=True, name=f"periodic-{i}")
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, wait: float = 30.0) -> None:
        """Stop taking objects; wait up to ``wait`` seconds in all for the rounds under way."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + wait
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stalled(self) -> list[tuple[Key, float]]:
        """The objects a worker has been on for longer than ``stall_after``, and how long."""
        now = self.clock()
        with self._cond:
            return sorted(
                (key, now - since)
                for key, since in self._running.items()
                if now - since > self.stall_after
            )

    def alive(self) -> bool:
        """False when a worker is stuck on one object or a worker thread ended by itself;
        True before ``start`` and after ``stop`` (nothing is expected of it then)."""
        with self._cond:
            if self._stopping or not self._threads:
                return True
        dead = [t.name for t in self._threads if not t.is_alive()]
        stuck = self.stalled()
        for (namespace, name), seconds in stuck:
            log.error("periodic work on %s/%s stuck for %.0f s", namespace, name, seconds)
        if dead:
            log.error("periodic workers ended: %s", ", ".join(dead))
        return not dead and not stuck

    # -- the workers ---------------------------------------------------------------------

    def _take(self) -> tuple[Key, contextvars.Context, bool] | None:
        """The object due first that no worker is on (waiting for one); None: stop."""
        with self._cond:
            while not self._stopping:
                now = self.clock()
                free = [(e.due, k) for k, e in self._objects.items() if k not in self._running]
                if free:
                    due, key = min(free)
                    if due <= now:
                        entry = self._objects[key]
                        self._running[key] = now
                        return key, entry.context, now - entry.converged >= self.resync
                    self._cond.wait(due - now)
                else:
                    self._cond.wait(self.interval)
            return None

    def _done(self, key: Key) -> None:
        with self._cond:
            self._running.pop(key, None)
            entry = self._objects.get(key)
            if entry is not None:
                entry.due = self.clock() + self.interval
            self._cond.notify()

    def _serve(self) -> None:
        while (taken := self._take()) is not None:
            (namespace, name), context, resync = taken
            try:
                context.run(self.work, namespace, name, resync)
            except Exception:  # one object's failure is its own; the worker goes on
                log.exception("%s/%s: periodic work failed", namespace, name)
            finally:
                self._done((namespace, name))
