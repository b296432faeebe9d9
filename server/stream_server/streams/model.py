"""The in-memory view of one stream: what is committed, and what is queued on top.

Readers see only the committed fields. Writers validate against the pending
fields, which run ahead by the operations queued for the next group commit;
if a batch fails, pending is reset to committed and nothing happened.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from stream_format.media import JSON_TYPE, media_type
from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES, KIND_JSON

__all__ = ["JSON_TYPE", "ProducerState", "Stream", "media_type"]


@dataclass(slots=True)
class ProducerState:
    epoch: int
    seq: int


class Stream:
    __slots__ = (
        "committed",
        "created",
        "inflight",
        "is_json",
        "kind",
        "meta",
        "p_producers",
        "p_tail",
        "path",
        "pmeta",
        "producers",
        "read_hint",
        "recent",
        "tail",
        "waiters",
    )

    def __init__(self, path: str, meta: StreamMeta, tail: int, *, committed: bool) -> None:
        self.path = path
        self.meta = meta  # committed configuration and state
        self.pmeta = replace(meta)  # pending: meta plus queued changes
        self.tail = tail  # committed tail unit
        self.p_tail = tail
        self.producers: dict[str, ProducerState] = {}
        self.p_producers: dict[str, ProducerState] = {}  # overlay of queued producer updates
        self.committed = committed  # False until the create itself is durable
        self.created: asyncio.Future | None = None  # resolves True/False when the create settles
        self.inflight: asyncio.Future | None = (
            None  # the last batch that carries this stream's changes
        )
        self.is_json = media_type(meta.content_type) == JSON_TYPE
        self.kind = KIND_JSON if self.is_json else KIND_BYTES
        self.waiters: set[asyncio.Future] = set()  # live readers waiting for a change
        self.read_hint: tuple[int, int] | None = None
        # (first unit, stop unit, payloads, bytes) of the last commits while readers wait
        self.recent: tuple[int, int, list, int] | None = None

    @property
    def id(self) -> int:
        return self.meta.id

    def producer(self, producer_id: str) -> ProducerState | None:
        return self.p_producers.get(producer_id) or self.producers.get(producer_id)

    def reset_pending(self) -> None:
        self.pmeta = replace(self.meta)
        self.p_tail = self.tail
        self.p_producers.clear()

    def notify(self) -> None:
        """Wake every live reader waiting on this stream."""
        if self.waiters:
            for w in self.waiters:
                if not w.done():
                    w.set_result(True)
            self.waiters.clear()

    def expired(self, now: float) -> bool:
        return self.meta.expired(now)
