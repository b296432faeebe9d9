"""What the layers above ask of the stream store: two narrow typed interfaces.

The protocol layer (``ProtocolStore``) and subscriptions
(``SubscriptionStore``) are typed against these, never against the concrete
``StreamStore``, so that each side can change alone: the HTTP handlers do
not see the commit pipeline, the engine or the sweepers, and another store
(a read-only archive follower, a store that spans shards) needs to offer
only these operations to serve the same protocol. ``StreamStore`` implements
both; ``_implements`` at the end of ``store.py`` makes mypy check that it does.

The values that cross the interface are plain data (``requests.py``) and the
in-memory ``Stream`` (``model.py``), whose committed fields readers may look at
but never change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from stream_server.streams.model import Stream
from stream_server.streams.requests import (
    AppendRequest,
    AppendResult,
    CreateRequest,
    CreateResult,
    ReadResult,
)


class ProtocolStore(Protocol):
    """The operations the HTTP protocol layer performs, one per request kind."""

    async def open(self, path: str, *, touch: bool = False) -> Stream:
        """The committed stream at ``path`` (``touch``: a read renews its TTL);
        NotFound or Gone when there is none. Asynchronous so that a worker process
        (``workers/``) can ask the writer for it."""
        ...

    def earliest(self, s: Stream) -> int:
        """The first unit a read of ``s`` may ask for (0 until retention drops data)."""
        ...

    def is_current(self, s: Stream) -> bool:
        """Whether ``s`` is still the stream at its path (not deleted meanwhile)."""
        ...

    async def create(self, req: CreateRequest) -> CreateResult:
        """Create (or fork) a stream, or confirm an identical one; durable on return."""
        ...

    async def append(self, req: AppendRequest) -> AppendResult:
        """Append and/or close; durable on return."""
        ...

    async def delete(self, path: str) -> None:
        """Delete (soft while forks read through it); durable on return."""
        ...

    async def read(self, s: Stream, start: int, max_bytes: int) -> ReadResult:
        """Committed data of ``s`` from ``start``, at most about ``max_bytes``."""
        ...

    async def wait(
        self, s: Stream, unit: int, deadline: float, until: asyncio.Future[Any] | None = None
    ) -> bool:
        """Until ``s`` has data past ``unit`` or is closed (True), or until the loop
        time ``deadline``, ``until`` resolving or the store stopping (False)."""
        ...


class SubscriptionStore(Protocol):
    """What subscriptions need: the streams to link and wake, the wake stream's appends,
    and durable keyed values for the subscriptions themselves."""

    @property
    def streams(self) -> Mapping[str, Stream]:
        """Every stream by path (read only)."""
        ...

    @property
    def version(self) -> object:
        """Changes whenever anything was committed: a standby's read-only copy of the
        saved subscriptions is read again when it does."""
        ...

    async def append(self, req: AppendRequest) -> AppendResult: ...

    async def put_keyed_value(self, space: str, key: str, value: bytes | None) -> None:
        """Set (None: delete) one keyed value; durable on return."""
        ...

    def keyed_values(self, space: str) -> dict[str, bytes]:
        """Every committed keyed value of ``space`` by key."""
        ...
