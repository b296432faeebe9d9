"""Appends: how an accepted append changes a stream's pending state, and what its commit shows.

By the time ``reserve_append`` runs, the store has refused everything it is
going to refuse; from here on nothing fails, so the pending state can be
changed without a way back other than the batch-wide rollback. Once the batch
is durable, ``publish_append`` shows the new tail, configuration and producer
state at once and wakes the stream's live readers.

The two halves meet through ``Reserved``, a plain tuple rather than a closure:
the writer of ``--workers N`` runs both for every append of the pod, and a
closure over seven names costs it nine objects for the collector to track
(the writer's cost per append is the serial part of ``--workers N``: docs/workers.md).
"""

from __future__ import annotations

from dataclasses import replace

from stream_format.meta import StreamMeta
from stream_format.records import Producer
from stream_server.engine.ops import Append, DeleteProducer, Op, PutProducer, PutStream
from stream_server.streams.model import Stream
from stream_server.streams.producers import producers_to_forget
from stream_server.streams.recent import remember
from stream_server.streams.requests import AppendRequest

# What an append's commit makes visible: the stream, its payloads, the units they
# cover [first, tail), the configuration it writes (or None), the producers it evicts,
# and the producer tuple it accepted (or None).
Reserved = tuple[Stream, list[bytes], int, int, StreamMeta | None, list[str], Producer | None]

_NONE: list[str] = []  # no producer evicted: shared, never changed


def reserve_append(
    s: Stream, req: AppendRequest, payloads: list[bytes], ops: list[Op], *, max_producers: int
) -> tuple[Reserved, int, bool]:
    """Reserve ``req`` on ``s``, adding its operations to ``ops``: what its commit will
    publish, its payload bytes, and whether it writes the configuration (and TTL clock)."""
    pending = s.pending
    m = pending.meta
    p = req.producer
    size = sum(map(len, payloads))
    first = pending.tail
    tail = pending.tail = first + s.units(payloads)
    if p is None and req.stream_seq is None and not req.close and m.ttl is None:
        if payloads:  # the common append: data, and nothing else
            ops.append(Append(s.id, s.kind, payloads, None))
        return (s, payloads, first, tail, None, _NONE, None), size, False
    mine: list[Op] = []
    # A fresh tuple: the commit recognises its own pending entry by identity.
    accepted = Producer(p.id, p.epoch, p.seq) if p is not None else None
    if payloads:
        mine.append(Append(s.id, s.kind, payloads, accepted))
    evicted = _NONE
    if accepted is not None:
        evicted = producers_to_forget(s.producers, pending.producers, accepted.id, max_producers)
        mine += [DeleteProducer(s.id, victim) for victim in evicted]
        pending.producers[accepted.id] = accepted
        mine.append(PutProducer(s.id, accepted.id, accepted.epoch, accepted.seq))
    meta_changed = False
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
        mine.append(PutStream(s.path, replace(new_meta)))
    ops += mine
    return (s, payloads, first, tail, new_meta, evicted, accepted), size, new_meta is not None


def publish_append(r: Reserved) -> None:
    """An append's batch is durable: its data, configuration and producer to readers."""
    s, payloads, first, tail, new_meta, evicted, accepted = r
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
