"""Building a batch (pure) and classifying storage errors."""

from __future__ import annotations

import errno

import lmdb

from stream_format import wal
from stream_format.meta import DB_INDEX, DB_STREAMS, DB_TAILS, StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine.batch import INDEX_GRANULARITY, Tail, build
from stream_server.engine.ops import Append, CreateLog, DropLog, PutStream
from stream_server.engine.storage_errors import from_lmdb_error, from_os_error


def test_the_frame_carries_exactly_the_changes_lmdb_applies(tmp_path):
    meta = StreamMeta(id=1, content_type="text/plain", created_at=0.0)
    ops = [
        CreateLog(1, 0),
        PutStream("s", meta),
        Append(1, KIND_BYTES, [b"x" * INDEX_GRANULARITY, b"y"]),
        DropLog(2),
    ]
    batch = build(ops, {2: Tail(16, 0, 0)}, now_us=1)
    path = tmp_path / "0000000000000001.wal"
    path.write_bytes(wal.encode_header(1) + batch.frame(7))
    (frame,) = wal.read_frames(path, last_file=True)
    writes = [e for e in frame.entries if e[0] == wal.WRITE]
    rest = [e for e in frame.entries if e[0] != wal.WRITE]
    assert rest == batch.changes  # one list: the WAL frame's and LMDB's
    assert [(sid, pos, bytes(data)) for _, sid, pos, data in writes] == [(1, 0, batch.writes[1][1])]
    dbs = [e[1] for e in batch.changes if e[0] == wal.PUT]
    assert DB_STREAMS in dbs and DB_INDEX in dbs and DB_TAILS in dbs
    assert batch.tails[1].unit == INDEX_GRANULARITY + 1
    assert batch.dropped == [2] and 2 not in batch.tails
    assert batch.stats.appends == 2


def test_storage_errors_are_classified_by_type_and_errno():
    assert from_os_error("w", OSError(errno.ENOSPC, "No space left on device")).disk_full
    assert from_os_error("w", OSError(errno.EDQUOT, "Disk quota exceeded")).disk_full
    assert not from_os_error("w", OSError(errno.EIO, "Input/output error")).disk_full
    assert from_lmdb_error("c", lmdb.MapFullError("mdb_put: MDB_MAP_FULL")).disk_full
    assert from_lmdb_error("c", lmdb.Error("mdb_txn_commit: No space left on device")).disk_full
    assert not from_lmdb_error("c", lmdb.Error("mdb_txn_commit: Input/output error")).disk_full
