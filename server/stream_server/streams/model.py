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
import sys
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


class Stream:
    __slots__ = (
        "__weakref__",  # a replica's index by id must not keep a dropped stream alive
        "_pending",
        "committed",
        "created",
        "inflight",
        "is_json",
        "kind",
        "media",
        "meta",
        "path",
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
        self._pending: Pending | None = None  # made on first use (``pending``)
        self.committed = committed  # False until the create itself is durable
        self.created: asyncio.Future[bool] | None = (
            None  # resolves True/False when the create settles
        )
        self.inflight: asyncio.Future[BatchStats] | None = (
            None  # the last batch that carries this stream's changes
        )
        # The content type never changes; interned, so 1M streams hold a few strings.
        self.media = sys.intern(media_type(meta.content_type))
        self.is_json = self.media == JSON_TYPE
        self.kind = KIND_JSON if self.is_json else KIND_BYTES
        # Live readers waiting for a change; None until the first (an empty set is 216 bytes).
        self.waiters: set[asyncio.Future[bool]] | None = None
        self.read_hint: tuple[int, int] | None = None
        self.recent: RecentWindow | None = None  # the last commits, while readers wait

    @property
    def id(self) -> int:
        return self.meta.id

    @property
    def pending(self) -> Pending:
        """The state with queued changes applied, made on first use: until then there
        are none, and it would be a copy of the committed state: a stream loaded to be
        read makes none."""
        p = self._pending
        if p is None:
            p = self._pending = Pending(self.meta, self.tail)
        return p

    def producer(self, producer_id: str) -> Producer | None:
        """The producer's last accepted tuple, counting appends still queued."""
        p = self._pending
        queued = p.producers.get(producer_id) if p is not None else None
        return queued or self.producers.get(producer_id)

    def queued(self) -> bool:
        """Whether a change of this stream is queued (its pending state is ahead)."""
        p = self._pending
        return p is not None and (p.tail != self.tail or bool(p.producers))

    def reset_pending(self) -> None:
        """Forget the queued changes: back to the committed state (a rollback resets
        every stream, so this makes no copy)."""
        self._pending = None

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
