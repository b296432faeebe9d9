"""Appends: how an accepted append changes a stream's pending state, and what its commit shows.

By the time ``queue_append`` runs, the store has refused everything it is
going to refuse; from here on nothing fails, so the pending state can be
changed without a way back other than the batch-wide rollback. The commit
action then publishes the new tail, configuration and producer state at once
and wakes the stream's live readers.
"""

from __future__ import annotations

from dataclasses import replace

from stream_format.records import Producer
from stream_server.engine.ops import Append, DeleteProducer, Op, PutProducer, PutStream
from stream_server.streams.model import Stream
from stream_server.streams.pending import Queued
from stream_server.streams.producers import producers_to_forget
from stream_server.streams.recent import remember
from stream_server.streams.requests import AppendRequest


def queue_append(  # noqa: C901 - the append path: one check-and-reserve step, no extra call
    s: Stream, req: AppendRequest, payloads: list[bytes], *, max_producers: int
) -> tuple[Queued, bool]:
    """Reserve ``req`` on ``s``; also whether it writes the configuration (and TTL clock)."""
    m = s.pending.meta
    p = req.producer
    ops: list[Op] = []
    # A fresh tuple: the commit action recognises its own pending entry by identity.
    accepted = Producer(p.id, p.epoch, p.seq) if p is not None else None
    size = 0
    if payloads:
        ops.append(Append(s.id, s.kind, payloads, accepted))
        s.pending.tail += s.units(payloads)
        size = sum(map(len, payloads))
    meta_changed = False
    evicted: list[str] = []
    if accepted is not None:
        evicted = producers_to_forget(s.producers, s.pending.producers, accepted.id, max_producers)
        ops += [DeleteProducer(s.id, victim) for victim in evicted]
        s.pending.producers[accepted.id] = accepted
        ops.append(PutProducer(s.id, accepted.id, accepted.epoch, accepted.seq))
    if req.stream_seq is not None:
        m.stream_seq = req.stream_seq
        meta_changed = True
    if req.close:
        m.closed = True
        m.closed_by = (p.id, p.epoch, p.seq) if p is not None else None
        meta_changed = True
    if m.ttl is not None:
        meta_changed = True
    new_meta = replace(m) if meta_changed else None
    if new_meta is not None:
        ops.append(PutStream(s.path, replace(new_meta)))
    tail = s.pending.tail
    first = tail - s.units(payloads)

    def apply() -> None:
        if payloads:
            s.recent = remember(s.recent, first, tail, payloads) if s.waiters else None
        s.tail = tail
        if new_meta is not None:
            new_meta.touched_at = max(new_meta.touched_at, s.meta.touched_at)
            s.meta = new_meta
        for victim in evicted:
            s.producers.pop(victim, None)
        if accepted is not None:
            s.producers.pop(accepted.id, None)  # re-inserted last: the dict is in recency order
            s.producers[accepted.id] = accepted
            if s.pending.producers.get(accepted.id) is accepted:
                del s.pending.producers[accepted.id]
        s.notify()

    return Queued(ops, size, tail, apply), new_meta is not None
