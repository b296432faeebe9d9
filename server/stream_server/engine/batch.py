"""One group-commit batch, built from its operations: what to write where.

Pure: no I/O. ``build`` turns the stream layer's operations into the bytes
to append to each segment file and one list of metadata changes. That one
list is both what the WAL frame carries and what LMDB applies, so the two
can never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from stream_format import wal
from stream_format.meta import (
    DB_INDEX,
    DB_INFO,
    DB_PRODUCERS,
    DB_RECORDS,
    DB_STREAMS,
    DB_TAILS,
    KEY_NEXT_STREAM_ID,
    PRODUCER,
    U64,
    TailValue,
    encode_tail,
    id_key,
    index_key,
    producer_key,
    record_key,
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
    DeleteProducer,
    DeleteRecord,
    DeleteStream,
    DropHead,
    DropLog,
    Op,
    PutProducer,
    PutRecord,
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
    changes: list[wal.Entry] = []
    chunks: dict[int, tuple[int, list[bytes]]] = {}  # stream id -> (start position, records)
    local: dict[int, Tail] = {}
    dropped: list[int] = []
    heads: dict[int, int] = {}
    stats = BatchStats()

    def put(db: int, key: bytes, value: bytes) -> None:
        changes.append((wal.PUT, db, key, value))

    for op in ops:
        if isinstance(op, Append):
            tail = local.get(op.stream_id)
            if tail is None:
                old = tails[op.stream_id]
                tail = local[op.stream_id] = Tail(
                    old.file_len, old.unit, old.base, old.start, old.start_pos
                )
            records = chunks.setdefault(op.stream_id, (tail.file_len, []))[1]
            for payload in op.payloads:
                rec = encode_record(op.kind, payload, tail.unit, now_us, op.producer)
                start = tail.file_len
                end = start + len(rec)
                records.append(rec)
                tail.file_len = end
                tail.unit += record_units(op.kind, len(payload))
                if start // INDEX_GRANULARITY != end // INDEX_GRANULARITY:
                    put(DB_INDEX, index_key(op.stream_id, tail.unit), U64.pack(end))
                stats.appends += 1
                stats.bytes += len(payload)
        elif isinstance(op, PutStream):
            put(DB_STREAMS, stream_key(op.path), op.meta.to_json())
        elif isinstance(op, PutProducer):
            key = producer_key(op.stream_id, op.producer_id)
            put(DB_PRODUCERS, key, PRODUCER.pack(op.epoch, op.seq))
        elif isinstance(op, DeleteProducer):
            changes.append((wal.DELETE, DB_PRODUCERS, producer_key(op.stream_id, op.producer_id)))
        elif isinstance(op, CreateLog):
            local[op.stream_id] = Tail(
                FILE_HEADER_SIZE, op.start_unit, op.start_unit, op.start_unit, FILE_HEADER_SIZE
            )
            chunks[op.stream_id] = (0, [encode_file_header(op.stream_id)])
            put(DB_INFO, KEY_NEXT_STREAM_ID, U64.pack(op.stream_id + 1))
        elif isinstance(op, DeleteStream):
            changes.append((wal.DELETE, DB_STREAMS, stream_key(op.path)))
        elif isinstance(op, PutRecord):
            put(DB_RECORDS, record_key(op.space, op.key), op.value)
        elif isinstance(op, DeleteRecord):
            changes.append((wal.DELETE, DB_RECORDS, record_key(op.space, op.key)))
        elif isinstance(op, DropHead):
            sid = op.stream_id
            now_at = local.get(sid) or tails.get(sid)
            # Only forward, only to a record start inside the committed log (the
            # engine resolved the position from the log): a late or repeated drop
            # is a no-op, never a move back.
            if (
                now_at is None
                or sid in dropped  # the stream's data goes in this batch
                or op.unit <= now_at.start
                or op.unit > now_at.unit
                or op.pos > now_at.file_len
            ):
                continue
            if sid not in local:
                local[sid] = Tail(
                    now_at.file_len, now_at.unit, now_at.base, now_at.start, now_at.start_pos
                )
            local[sid].start, local[sid].start_pos = op.unit, op.pos
            heads[sid] = op.pos
            for key in op.index_keys:
                changes.append((wal.DELETE, DB_INDEX, key))
        elif isinstance(op, DropLog):
            sid = op.stream_id
            local.pop(sid, None)
            chunks.pop(sid, None)
            heads.pop(sid, None)
            dropped.append(sid)
            changes.append((wal.DELETE, DB_TAILS, id_key(sid)))
            for db in (DB_PRODUCERS, DB_INDEX):
                changes.append((wal.DELETE_PREFIX, db, id_key(sid)))
    for sid, tail in local.items():
        put(DB_TAILS, id_key(sid), encode_tail(tail.value()))
    writes = {sid: (start, b"".join(recs)) for sid, (start, recs) in chunks.items()}
    return Batch(writes, changes, local, dropped, heads, stats)
