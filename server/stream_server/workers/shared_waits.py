"""One wait at the writer for all of a worker's readers of a stream at the same unit.

Live readers park in the workers, but only the writer sees commits, so each reader's
wait is a call on the link, and its answer is the writer's serial work (issue 28).
A stream's readers mostly wait at its tail together (a fan-out), so a worker asks
once per stream and unit, and hands the one answer to each reader still there. A
reader that hangs up leaves at once; the last one to leave ends the writer's wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

# A wait's stream (path and id: a new stream at the path is another) and unit.
WaitKey = tuple[str, int, int]


class SharedWait:
    """A wait under way at the writer for ``key``; ``rid`` is its call, ``deadline`` the
    loop time it was asked to end at (its first reader's), ``on_empty`` is told when its
    last reader leaves (a no-op once answered)."""

    __slots__ = ("deadline", "key", "on_empty", "readers", "rid")

    def __init__(
        self, key: WaitKey, rid: int, deadline: float, on_empty: Callable[[SharedWait], None]
    ) -> None:
        self.key = key
        self.rid = rid
        self.deadline = deadline
        self.on_empty = on_empty
        self.readers: set[asyncio.Future[Any]] = set()

    async def join(self, until: asyncio.Future[Any] | None) -> Any:
        """The writer's answer (or its error), or None once ``until`` resolves first."""
        reader: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.readers.add(reader)

        def hung_up(_: object) -> None:
            if not reader.done():
                reader.set_result(None)

        if until is not None:
            until.add_done_callback(hung_up)
        try:
            return await reader
        finally:
            if until is not None:
                until.remove_done_callback(hung_up)
            self.readers.discard(reader)
            if not self.readers:  # the last to leave: a no-op once answered
                self.on_empty(self)

    def answered(self, answer: asyncio.Future[Any]) -> None:
        """The writer's answer (or the link's failure), to every reader still here."""
        exc = answer.exception()  # no reader awaits the call itself: never cancelled
        for reader in self.readers:
            if reader.done():
                continue
            if exc is not None:
                reader.set_exception(exc)
            else:
                reader.set_result(answer.result())
