"""Idempotent producers: is an append from (id, epoch, seq) new, a retry, or refused?

One type names a producer everywhere: the format's ``Producer`` tuple is what
the request headers carry, what a stream remembers per producer id, what the
answer echoes and what a record stores on disk. The rules (PROTOCOL.md 5.2)
are a pure function of the request's tuple and the producer's last accepted
one, so they read and test without a store; the store acts on the verdict
(counts it, waits for the original, refuses, or queues the append).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from stream_format.records import Producer
from stream_server.streams.errors import BadRequest, ProducerFenced, SequenceGap, StreamError

__all__ = ["MAX_PRODUCER_ID_BYTES", "Producer", "Verdict", "check_producer", "producers_to_forget"]

# Producer ids end up in LMDB keys.
MAX_PRODUCER_ID_BYTES = 256


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with an append's producer tuple.

    With ``error``, refuse the append with it. With ``duplicate``, the append is
    a retry of one already accepted: acknowledge it, echoing ``duplicate``,
    once the original is durable. With neither, accept it. ``event`` names what
    the metrics count: "duplicate", "fenced" or "gap".
    """

    error: StreamError | None = None
    duplicate: Producer | None = None
    event: str | None = None


ACCEPT = Verdict()


def check_producer(p: Producer, last: Producer | None) -> Verdict:
    """Judge ``p`` against ``last``, the producer's last accepted tuple (None if unknown)."""
    if len(p.id.encode("utf-8", "surrogatepass")) > MAX_PRODUCER_ID_BYTES:
        return Verdict(BadRequest(f"Producer-Id longer than {MAX_PRODUCER_ID_BYTES} bytes"))
    if last is not None and p.epoch < last.epoch:
        return Verdict(ProducerFenced(last.epoch), event="fenced")
    if last is None or p.epoch > last.epoch:
        if p.seq == 0:
            return ACCEPT
        if last is None:
            return Verdict(SequenceGap(0, p.seq))
        return Verdict(BadRequest("a new producer epoch must start at Producer-Seq 0"))
    if p.seq <= last.seq:
        return Verdict(duplicate=Producer(p.id, p.epoch, last.seq), event="duplicate")
    if p.seq > last.seq + 1:
        return Verdict(SequenceGap(last.seq + 1, p.seq), event="gap")
    return ACCEPT


def producers_to_forget(
    committed: dict[str, Producer], pending: dict[str, Producer], pid: str, cap: int
) -> list[str]:
    """The least recently active producers to drop so that ``pid`` fits under ``cap``.

    PROTOCOL.md 5.2.1 lets a server expire producer state, after which the
    producer is treated as new: a forgotten producer's next sequence number
    gets a sequence-gap 409 (expected 0), so it cannot append past a hole;
    only a retry of its very first append could be taken twice, which the
    least-recently-active choice makes unlikely. Producers with a write in
    flight (in ``pending``) are never chosen. ``committed`` is kept in recency
    order.
    """
    if pid in committed or pid in pending:
        return []
    count = len(committed) + sum(1 for k in pending if k not in committed)
    excess = count + 1 - cap
    if excess <= 0:
        return []
    victims = list(itertools.islice(committed, excess + len(pending)))
    return [k for k in victims if k not in pending][:excess]
