"""The in-memory view of one stream: what is committed, and what is queued on top.

Readers see only the committed fields. Writers validate against the pending
fields (``Stream.pending``, a ``Pending``), which run ahead by the operations
queued for the next group commit; if a batch fails, pending is reset to
committed and nothing happened (``pending.StreamTable.rollback``). ``Pending``
lives here, not in ``pending.py``, so that the table of streams may import the
stream without the stream importing the table back.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from stream_format.media import JSON_TYPE, media_type
from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES, KIND_JSON, Producer
from stream_server.engine import BatchStats
from stream_server.streams.recent import RecentWindow

__all__ = ["JSON_TYPE", "Pending", "Stream", "media_type"]


class Pending:
    """One stream's state with its queued changes applied."""

    __slots__ = ("meta", "producers", "tail")

    def __init__(self, meta: StreamMeta, tail: int) -> None:
        self.meta = replace(meta)
        self.tail = tail
        # Only the producers a queued append changes: the committed ones sit under it.
        self.producers: dict[str, Producer] = {}

    def reset(self, meta: StreamMeta, tail: int) -> None:
        """Forget every queued change: back to the committed ``meta`` and ``tail``."""
        self.meta = replace(meta)
        self.tail = tail
        self.producers.clear()


class Stream:
    __slots__ = (
        "committed",
        "created",
        "inflight",
        "is_json",
        "kind",
        "media",
        "meta",
        "path",
        "pending",
        "producers",
        "read_hint",
        "recent",
        "tail",
        "waiters",
    )

    def __init__(self, path: str, meta: StreamMeta, tail: int, *, committed: bool) -> None:
        self.path = path
        self.meta = meta  # committed configuration and state
        self.tail = tail  # committed tail unit
        # Each producer's last accepted (id, epoch, seq), in recency order.
        self.producers: dict[str, Producer] = {}
        self.pending = Pending(meta, tail)
        self.committed = committed  # False until the create itself is durable
        self.created: asyncio.Future[bool] | None = (
            None  # resolves True/False when the create settles
        )
        self.inflight: asyncio.Future[BatchStats] | None = (
            None  # the last batch that carries this stream's changes
        )
        self.media = media_type(meta.content_type)  # the content type never changes
        self.is_json = self.media == JSON_TYPE
        self.kind = KIND_JSON if self.is_json else KIND_BYTES
        self.waiters: set[asyncio.Future[bool]] = set()  # live readers waiting for a change
        self.read_hint: tuple[int, int] | None = None
        self.recent: RecentWindow | None = None  # the last commits, while readers wait

    @property
    def id(self) -> int:
        return self.meta.id

    def producer(self, producer_id: str) -> Producer | None:
        """The producer's last accepted tuple, counting appends still queued."""
        return self.pending.producers.get(producer_id) or self.producers.get(producer_id)

    def reset_pending(self) -> None:
        self.pending.reset(self.meta, self.tail)

    def units(self, payloads: list[bytes]) -> int:
        """How many offset units ``payloads`` take: bytes, or JSON messages."""
        return sum(map(len, payloads)) if self.kind == KIND_BYTES else len(payloads)

    def notify(self) -> None:
        """Wake every live reader waiting on this stream."""
        if self.waiters:
            for w in self.waiters:
                if not w.done():
                    w.set_result(True)
            self.waiters.clear()

    def expired(self, now: float) -> bool:
        return self.meta.expired(now)
