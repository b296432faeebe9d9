"""Virtual time: an asyncio event loop whose clock moves only when nothing is ready.

The simulation runs the server's own async replication code (the role loop,
its Lease writes, the shipper), so its scheduler is asyncio's: ready callbacks
in FIFO order, timers in time order. Where a real loop would block in
``select`` until the next timer, this one moves its clock to that timer at
once. Nothing reads the wall clock, no thread or socket exists (not even the
self-pipe a selector loop opens), so a run is a pure function of its seed and
a minute of replica-set time takes milliseconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

START = 1000.0  # seconds: a stamp of 0 means "none" to the freshness rules, so not 0


class Stalled(RuntimeError):
    """Nothing is ready and no timer is due: the simulation has nothing left to run."""


class _Advance:
    """The selector's place in asyncio's loop: waiting ``timeout`` moves the clock."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise Stalled("no task is ready and no timer is due")
        self.loop.now = max(self.loop.now, self.loop.now + timeout)
        return []

    def close(self) -> None:
        pass


class VirtualLoop(asyncio.BaseEventLoop):
    """A single-threaded event loop on virtual time (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self._selector = _Advance(self)

    def time(self) -> float:
        return self.now

    def now_ns(self) -> int:
        return int(self.now * 1_000_000_000)

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        """Only a call from another thread needs waking the loop; none exists here."""
