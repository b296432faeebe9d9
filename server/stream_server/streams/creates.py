"""Creates: the new stream a validated create reserves, and what its commit shows.

A new stream enters the table at once, uncommitted: a second create of the
same path meanwhile waits for this one (``Stream.created``) rather than racing
it, and every other operation still answers 404 until the create is durable.
A fork also counts one more reference on its source in the same batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from stream_format.meta import StreamMeta
from stream_server.engine.ops import Append, CreateLog, Op, PutStream
from stream_server.streams.expiry import Lifetime
from stream_server.streams.forks import queue_reference
from stream_server.streams.model import Stream
from stream_server.streams.pending import Queued
from stream_server.streams.requests import CreateRequest


def queue_create(
    req: CreateRequest,
    *,
    sid: int,
    now: float,
    content_type: str,
    life: Lifetime,
    source: Stream | None,
    fork_unit: int,
    payloads: list[bytes],
    on_durable: Callable[[Stream], None],
) -> tuple[Stream, Queued]:
    """The new, uncommitted stream and its queued change; ``on_durable`` runs on commit."""
    meta = StreamMeta(
        id=sid,
        content_type=content_type,
        created_at=now,
        ttl=life.ttl,
        expires_at=life.expires_at,
        expires_at_ts=life.expires_at_ts,
        closed=req.closed,
        fork_from=source.path if source else None,
        fork_offset=fork_unit,
        touched_at=now,
        extra={"expiry_from": life.expiry_from},
    )
    s = Stream(req.path, meta, fork_unit, committed=False)
    ops: list[Op] = [CreateLog(sid, fork_unit)]
    size = 0
    if payloads:
        ops.append(Append(sid, s.kind, payloads))
        s.pending.tail = fork_unit + s.units(payloads)
        size = sum(map(len, payloads))
    ops.append(PutStream(req.path, replace(meta)))
    counted: Callable[[], None] | None = None
    if source is not None:
        reference, counted = queue_reference(source)
        ops.append(reference)
    tail = s.pending.tail

    def apply() -> None:
        s.committed = True
        s.tail = tail
        assert s.created is not None
        s.created.set_result(True)
        if counted is not None:
            counted()
        on_durable(s)

    return s, Queued(ops, size, tail, apply)
