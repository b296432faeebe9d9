"""A broadcast wake-up for the write path's waits: ``notify`` wakes every
current waiter, and each wait also ends by itself after its bound.

``asyncio.wait_for(event.wait(), t)`` takes three turns of the event loop to
wake its waiter (the event's future, the task ``wait_for`` wraps around
``event.wait()``, then its release of the outer waiter), and a replicated
write waited twice: a standby's fetch for the frame, then the write for the
standbys' acknowledgements. A future per waiter wakes it in one turn
(docs/performance.md, "The write path's round trip, second round").
"""

from __future__ import annotations

import asyncio


class Signal:
    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        """Wake everyone waiting now; a later ``wait`` waits for the next notify."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self, at_most: float) -> None:
        """Until the next ``notify`` or ``at_most`` seconds, whichever comes first. A
        bound of its own rather than the caller's ``asyncio.timeout``, which would cost
        the turns this class exists to save (above); the waits it serves want the
        bound anyway (they look again at what they wait for)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append(fut)
        timer = loop.call_later(max(at_most, 0.0), _expire, fut)
        try:
            await fut
        finally:
            timer.cancel()
            if fut in self._waiters:  # timed out or cancelled: not left behind
                self._waiters.remove(fut)

    def __len__(self) -> int:
        """Waiters not yet woken."""
        return len(self._waiters)


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
