"""The operations a group-commit batch is made of.

The stream layer decides what happens; the engine only makes it durable, in
the order given, all or nothing per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stream_format.meta import StreamMeta
from stream_format.records import Producer


@dataclass(slots=True)
class PutStream:
    path: str
    meta: StreamMeta


@dataclass(slots=True)
class DeleteStream:
    path: str


@dataclass(slots=True)
class CreateLog:
    """Start a segment file whose first record will cover ``start_unit``."""

    stream_id: int
    start_unit: int


@dataclass(slots=True)
class Append:
    stream_id: int
    kind: int
    payloads: list[bytes]
    producer: Producer | None = None


@dataclass(slots=True)
class PutProducer:
    stream_id: int
    producer_id: str
    epoch: int
    seq: int


@dataclass(slots=True)
class DeleteProducer:
    """Forget one producer's state (the stream keeps too many): it is treated as new after."""

    stream_id: int
    producer_id: str


@dataclass(slots=True)
class DropLog:
    """Forget a stream's data: tail, index, producers, and (after commit) its file."""

    stream_id: int


@dataclass(slots=True)
class DropHead:
    """Retention: move a stream's retained start forward to ``unit``, the record that
    starts at file position ``pos`` (``Engine.retention_point`` finds both).

    The new start commits with the batch (the ``tails`` value, so it is in the
    WAL frame like every other change); only then does the engine punch the
    bytes below it out of the file. ``index_keys`` (filled in by the engine)
    are the index entries below the new start, deleted with it.
    """

    stream_id: int
    unit: int
    pos: int
    index_keys: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class PutKeyedValue:
    """Set one keyed value: state of another part of the server (a subscription, say),
    durable with the batch and recovered like stream metadata. Opaque to the engine."""

    space: str
    key: str
    value: bytes


@dataclass(slots=True)
class DeleteKeyedValue:
    """Remove one keyed value (nothing happens if it is not there)."""

    space: str
    key: str


Op = (
    PutStream
    | DeleteStream
    | CreateLog
    | Append
    | PutProducer
    | DeleteProducer
    | DropLog
    | DropHead
    | PutKeyedValue
    | DeleteKeyedValue
)
