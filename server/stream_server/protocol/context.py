"""What every protocol handler shares: the settings, the store, and small request helpers.

The handlers are plain functions, one module per group of operations, so
that each can be read alone; ``Context`` is the one object they take in
place of ``self``. It is built once per server by ``StreamRoutes`` and never
changes, so handlers never need to ask where a setting or the store came
from.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from stream_format.offsets import OffsetError, parse_offset
from stream_server.auth import TokenAuth
from stream_server.declared.network import ProtocolSettings
from stream_server.protocol.headers import CONTENT_LENGTH, CONTENT_TYPE
from stream_server.protocol.http import Headers, Receive, Scope, read_body
from stream_server.protocol.live import ReaderSlots
from stream_server.protocol.paths import stream_path
from stream_server.request_metrics import RequestMetrics
from stream_server.streams.errors import BadRequest
from stream_server.streams.interface import ProtocolStore
from stream_server.streams.requests import ReadResult

CACHE_READ = b"public, max-age=60, stale-while-revalidate=300"
# With auth on, a shared cache must not hand one client's stream to another (section 10.1).
CACHE_READ_PRIVATE = b"private, max-age=60, stale-while-revalidate=300"
CACHE_NONE = b"no-store"
# A catch-up read holds at most this much in memory at once; larger binary responses
# are streamed in chunks of this size (JSON responses stop at it).
READ_CHUNK_BYTES = 4 * 1024 * 1024
TRUE = b"true"
MAX_SEGMENT_BYTES = 255  # longest path segment: a fixed limit of the protocol, not a setting


class ReadGate(Protocol):
    """Whether this server may answer reads now: a replica set's member answers them
    only while it knows it is current within its staleness bound (docs/replication.md,
    "Reads"). A single node has none: it is always current."""

    def fresh_for(self) -> float:
        """Seconds reads stay answerable without news (0: refuse them now)."""
        ...

    def read_refusal(self) -> tuple[int, Headers, bytes] | None:
        """None while reads may be answered; else the refusal to send."""
        ...

    def stale(self) -> asyncio.Future[None]:
        """Resolves once reads may no longer be answered (done already if so now): one
        future that every live read waits on beside its data."""
        ...


class Limiter(Protocol):
    """A per-client request rate (``RateLimiter``; a worker's asks the writer's)."""

    async def admit(self, client: str) -> float:
        """0 if the request may go ahead, else the seconds to wait before retrying."""
        ...


class Slots(Protocol):
    """The live readers' slots (``ReaderSlots``; a worker's takes the writer's)."""

    by_mode: dict[str, int]

    def held(self, mode: str, client: str) -> AbstractAsyncContextManager[None]:
        """A slot for the duration of the block; 503 when full, 429 past the client's share."""
        ...


class Context:
    """The server's side of every request; the derived values are computed once, here."""

    def __init__(
        self,
        store: ProtocolStore,
        settings: ProtocolSettings,
        metrics: RequestMetrics | None = None,
        *,
        auth: TokenAuth | None = None,
        limiter: Limiter | None = None,
        read_gate: ReadGate | None = None,
        slots: Slots | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.auth = auth
        self.limiter = limiter
        self.read_gate = read_gate  # a replica set member's (app.py); None on a single node
        self.base = settings.base_path.encode()
        self.slots: Slots = slots or ReaderSlots.capped(
            settings.max_live_readers, settings.max_live_readers_per_client
        )
        self.cache_read = CACHE_READ if auth is None else CACHE_READ_PRIVATE
        # What one read holds in memory: JSON and live responses stop at it.
        self.read_chunk = min(settings.max_read_bytes, READ_CHUNK_BYTES)

    def stream_path(self, raw: bytes) -> str:
        return stream_path(
            raw,
            self.base,
            max_bytes=self.settings.max_path_bytes,
            max_segment=MAX_SEGMENT_BYTES,
        )

    def source_path(self, value: str) -> str:
        """Stream-Forked-From names a path on this server: full URL path or stream path."""
        raw = value.strip().encode()
        if raw.startswith(self.base):
            return self.stream_path(raw)
        return self.stream_path(self.base + raw.lstrip(b"/"))

    async def read_body(self, receive: Receive, h: dict[str, str]) -> bytes:
        """The request body, under the size limit and the slow-body rules (413, 408)."""
        return await read_body(
            receive,
            self.settings.max_body_bytes,
            h.get(CONTENT_LENGTH.key),
            self.settings.body_timeout,
            self.settings.min_body_rate,
        )

    def observe_read(self, result: ReadResult) -> None:
        if self.metrics is not None:
            size = sum(map(len, result.payloads))
            self.metrics.read_size.observe(size)
            self.metrics.read_bytes.inc(size)


def raw_path(scope: Scope) -> bytes:
    raw: bytes | None = scope.get("raw_path")
    if raw:
        return raw
    path: str = scope["path"]
    return path.encode()


def offset_unit(value: str, *, allow_now: bool = True) -> int:
    """An offset from a request, as a 400 when it is not one."""
    try:
        return parse_offset(value, allow_now=allow_now)
    except OffsetError as exc:
        raise BadRequest(str(exc)) from None


def content_type(h: dict[str, str]) -> str | None:
    ct = h.get(CONTENT_TYPE.key)
    if ct is None:
        return None
    ct = ct.strip()
    return ct or None
