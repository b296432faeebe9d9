"""One group-commit batch, built from its operations: what to write where.

Pure: no I/O. ``build`` turns the stream layer's operations into the bytes
to append to each segment file and one list of metadata changes. That one
list is both what the WAL frame carries and what LMDB applies, so the two
can never drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_format import wal
from stream_format.meta import (
    DB_INDEX,
    DB_INFO,
    DB_INLINE,
    DB_PRODUCERS,
    DB_RECORDS,
    DB_STREAMS,
    DB_TAILS,
    KEY_NEXT_STREAM_ID,
    PRODUCER,
    U64,
    TailValue,
    encode_tail_fields,
    id_key,
    index_key,
    producer_key,
    space_key,
    stream_key,
)
from stream_format.records import (
    FILE_HEADER_SIZE,
    encode_file_header,
    encode_record,
    record_units,
)
from stream_server.engine.ops import (
    Append,
    CreateLog,
    DeleteKeyedValue,
    DeleteProducer,
    DeleteStream,
    DropHead,
    DropLog,
    Op,
    PutKeyedValue,
    PutProducer,
    PutStream,
)

INDEX_GRANULARITY = 16 * 1024  # at most this many bytes scanned to find a unit


@dataclass(slots=True)
class Tail:
    file_len: int
    unit: int
    base: int  # first unit of the stream's own log (its fork offset, or 0)
    start: int = -1  # first retained unit: base (-1 says so) until a DropHead moves it
    start_pos: int = FILE_HEADER_SIZE  # file position of the record that starts at ``start``

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.base

    def value(self) -> TailValue:
        return TailValue(self.file_len, self.unit, self.base, self.start, self.start_pos)


@dataclass(slots=True)
class BatchStats:
    """Where one batch's time went, for metrics and slow-append logs."""

    appends: int = 0
    bytes: int = 0
    write_seconds: float = 0.0
    fsync_seconds: float = 0.0
    commit_seconds: float = 0.0
    term: int = 0  # the replica set's term the batch was written at (0: not in a set)


@dataclass(slots=True)
class Batch:
    writes: dict[int, tuple[int, bytes]]  # stream id -> (file position, bytes to write there)
    changes: list[wal.Entry]  # metadata, in order: the WAL frame's and LMDB's
    tails: dict[int, Tail]  # the new tail of every stream written
    dropped: list[int]  # streams whose data goes (their files are removed after commit)
    heads: dict[int, int]  # stream id -> new retained start position (punched after commit)
    stats: BatchStats = field(default_factory=BatchStats)

    def frame(self, lsn: int) -> bytes:
        """The WAL frame: the records as positional writes, then the metadata changes."""
        data = [(wal.WRITE, sid, pos, data) for sid, (pos, data) in self.writes.items()]
        return wal.encode_frame(lsn, [*data, *self.changes])


def build(ops: list[Op], tails: Mapping[int, Tail], now_us: int) -> Batch:
    """The batch that carries out ``ops`` in order on streams at ``tails``."""
    b = _Builder(tails, now_us)
    steps = b.steps
    for op in ops:
        steps[type(op)](op)
    return b.batch()


class _Builder:
    """One batch under construction: a method per kind of operation (``steps``), each
    adding to the records per stream and to the one list of metadata changes."""

    def __init__(self, tails: Mapping[int, Tail], now_us: int) -> None:
        self.tails = tails  # as committed
        self.now_us = now_us
        self.changes: list[wal.Entry] = []
        self.chunks: dict[int, tuple[int, list[bytes]]] = {}  # sid -> (start position, records)
        self.local: dict[int, Tail] = {}  # the tails this batch moves
        self.dropped: list[int] = []
        self.heads: dict[int, int] = {}
        self.stats = BatchStats()
        self.steps: dict[type, Callable[[Any], None]] = {
            Append: self.append,
            PutStream: lambda op: self.put(DB_STREAMS, stream_key(op.path), op.meta.to_json()),
            PutProducer: lambda op: self.put(
                DB_PRODUCERS,
                producer_key(op.stream_id, op.producer_id),
                PRODUCER.pack(op.epoch, op.seq),
            ),
            DeleteProducer: lambda op: self.delete(
                DB_PRODUCERS, producer_key(op.stream_id, op.producer_id)
            ),
            CreateLog: self.create_log,
            DeleteStream: lambda op: self.delete(DB_STREAMS, stream_key(op.path)),
            PutKeyedValue: lambda op: self.put(DB_RECORDS, space_key(op.space, op.key), op.value),
            DeleteKeyedValue: lambda op: self.delete(DB_RECORDS, space_key(op.space, op.key)),
            DropHead: self.drop_head,
            DropLog: self.drop_log,
        }

    def put(self, db: int, key: bytes, value: bytes) -> None:
        self.changes.append((wal.PUT, db, key, value))

    def delete(self, db: int, key: bytes) -> None:
        self.changes.append((wal.DELETE, db, key))

    def moved(self, sid: int) -> Tail:
        """The stream's tail as this batch moves it (a copy of the committed one)."""
        tail = self.local.get(sid)
        if tail is None:
            old = self.tails[sid]
            tail = self.local[sid] = Tail(
                old.file_len, old.unit, old.base, old.start, old.start_pos
            )
        return tail

    def append(self, op: Append) -> None:
        sid, kind, producer, now_us = op.stream_id, op.kind, op.producer, self.now_us
        tail = self.moved(sid)
        records = self.chunks.setdefault(sid, (tail.file_len, []))[1]
        stats = self.stats
        unit, end = tail.unit, tail.file_len
        for payload in op.payloads:
            rec = encode_record(kind, payload, unit, now_us, producer)
            start = end
            end = start + len(rec)
            records.append(rec)
            unit += record_units(kind, len(payload))
            if start // INDEX_GRANULARITY != end // INDEX_GRANULARITY:
                self.put(DB_INDEX, index_key(sid, unit), U64.pack(end))
            stats.appends += 1
            stats.bytes += len(payload)
        tail.unit, tail.file_len = unit, end

    def create_log(self, op: CreateLog) -> None:
        unit = op.start_unit
        self.local[op.stream_id] = Tail(FILE_HEADER_SIZE, unit, unit, unit, FILE_HEADER_SIZE)
        self.chunks[op.stream_id] = (0, [encode_file_header(op.stream_id)])
        self.put(DB_INFO, KEY_NEXT_STREAM_ID, U64.pack(op.stream_id + 1))

    def drop_head(self, op: DropHead) -> None:
        sid = op.stream_id
        now_at = self.local.get(sid) or self.tails.get(sid)
        # Only forward, only to a record start inside the committed log (the engine
        # resolved the position from the log): a late or repeated drop is a no-op,
        # never a move back.
        if (
            now_at is None
            or sid in self.dropped  # the stream's data goes in this batch
            or op.unit <= now_at.start
            or op.unit > now_at.unit
            or op.pos > now_at.file_len
        ):
            return
        tail = self.moved(sid)
        tail.start, tail.start_pos = op.unit, op.pos
        self.heads[sid] = op.pos
        for key in op.index_keys:
            self.delete(DB_INDEX, key)

    def drop_log(self, op: DropLog) -> None:
        sid = op.stream_id
        self.local.pop(sid, None)
        self.chunks.pop(sid, None)
        self.heads.pop(sid, None)
        self.dropped.append(sid)
        self.delete(DB_TAILS, id_key(sid))
        self.delete(DB_INLINE, id_key(sid))  # its log, if it was kept inline (format 5)
        for db in (DB_PRODUCERS, DB_INDEX):
            self.changes.append((wal.DELETE_PREFIX, db, id_key(sid)))

    def batch(self) -> Batch:
        changes = self.changes
        for sid, t in self.local.items():
            value = encode_tail_fields(t.file_len, t.unit, t.base, t.start, t.start_pos)
            changes.append((wal.PUT, DB_TAILS, id_key(sid), value))
        writes = {sid: (start, b"".join(recs)) for sid, (start, recs) in self.chunks.items()}
        return Batch(writes, self.changes, self.local, self.dropped, self.heads, self.stats)
