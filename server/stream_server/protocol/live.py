"""Live readers (long-poll and SSE): their slots, and noticing when their client hangs up.

A live reader holds server resources for as long as its connection is open,
so both the total and one client's share are capped, and a slot is counted
from the moment it is granted until the handler has finished with the
connection (its last send included). A client that hangs up frees its slot at
once: the request's receive channel reports the disconnect, which resolves a
future the reader's wait also listens to, so no reader lingers until its
timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from stream_server.protocol.http import Receive
from stream_server.streams.errors import StreamError, Unavailable

MODES = ("long-poll", "sse")


class TooManyRequests(StreamError):
    """One client's share of a limit is used up: 429, while others are still served."""


class ReaderSlots:
    """A cap on live readers in total and per client (address, or token name with auth)."""

    @classmethod
    def capped(cls, total: int, per_client: int) -> ReaderSlots:
        """``per_client`` 0: a tenth of the total (``--max-live-readers-per-client``)."""
        return cls(total, per_client or max(1, total // 10))

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.by_mode: dict[str, int] = dict.fromkeys(MODES, 0)
        self.by_client: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def held(self, mode: str, client: str) -> AsyncIterator[None]:
        """``hold`` as the protocol layer takes it (a worker process takes the writer's
        slot instead, over its link: ``workers/linked_limits.py``)."""
        with self.hold(mode, client):
            yield

    @contextlib.contextmanager
    def hold(self, mode: str, client: str) -> Iterator[None]:
        """A slot for the duration of the block; 503 when full, 429 past the client's share."""
        if sum(self.by_mode.values()) >= self.total:
            raise Unavailable("too many live readers; retry later")
        held = self.by_client.get(client, 0)
        if held >= self.per_client:
            raise TooManyRequests("this client holds too many live readers; retry later")
        self.by_mode[mode] += 1
        self.by_client[client] = held + 1
        try:
            yield
        finally:
            self.by_mode[mode] -= 1
            left = self.by_client[client] - 1
            if left:
                self.by_client[client] = left
            else:
                del self.by_client[client]


class Hangup:
    """Resolves when the client disconnects; ``future`` can be handed to a wait.

    It consumes the request's receive channel (a GET has at most a body nobody
    reads), so use it only once the handler needs nothing more from the request.
    """

    def __init__(self, receive: Receive) -> None:
        self.future: asyncio.Future[None] = asyncio.ensure_future(_until_disconnect(receive))

    @property
    def happened(self) -> bool:
        return self.future.done() and not self.future.cancelled()

    def close(self) -> None:
        self.future.cancel()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
