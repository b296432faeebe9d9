"""Live readers: long-poll and SSE requests waiting for a stream to change.

Waiters are woken by commits (``Stream.notify``), never by polling. Each
waiter is one future and one timer: with thousands of idle long-polls, what a
wake-up costs per reader is what bounds the last reader's latency. All of
them are also held here, so that shutdown can end every wait at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from stream_server.streams.model import Stream


class LiveReaders:
    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[bool]] = set()

    async def wait(self, s: Stream, deadline: float, until: asyncio.Future[Any] | None) -> bool:
        """True when ``s`` changes; False once the loop's clock reaches ``deadline``, on
        ``until`` resolving, or on release."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        if s.waiters is None:
            s.waiters = set()
        s.waiters.add(waiter)
        self._waiters.add(waiter)
        timer = loop.call_at(deadline, _time_out, waiter)

        def hung_up(_: asyncio.Future[Any]) -> None:
            _time_out(waiter)

        if until is not None:
            until.add_done_callback(hung_up)
        try:
            return await waiter
        finally:
            timer.cancel()
            if s.waiters is not None:
                s.waiters.discard(waiter)
            self._waiters.discard(waiter)
            if until is not None:
                until.remove_done_callback(hung_up)

    def release(self) -> None:
        """End every wait as if it had timed out."""
        for waiter in list(self._waiters):
            _time_out(waiter)


def _time_out(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
