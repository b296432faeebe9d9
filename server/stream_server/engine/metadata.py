"""LMDB metadata: stream configuration, committed tails, producer state, record index.

LMDB is the index, the segment files are the data. Every value written here
in the normal path also travels in the batch's WAL frame, so LMDB runs with
``metasync=False`` (one flush per commit): a commit lost to a power cut is
redone from the WAL on the next start.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lmdb
import orjson

from stream_server.engine import fsio

# Database numbers as they appear in WAL frames.
DB_INFO = 0
DB_STREAMS = 1  # stream path (utf-8) -> StreamMeta (JSON)
DB_TAILS = 2  # stream id (u64 BE) -> Tail
DB_PRODUCERS = 3  # stream id (u64 BE) + producer id (utf-8) -> ProducerState
DB_INDEX = 4  # stream id (u64 BE) + unit (u64 BE) -> file position (u64 LE)

DB_NAMES = {
    DB_INFO: b"info",
    DB_STREAMS: b"streams",
    DB_TAILS: b"tails",
    DB_PRODUCERS: b"producers",
    DB_INDEX: b"index",
}

KEY_NEXT_STREAM_ID = b"next_stream_id"

# LMDB refuses keys longer than this (its compiled-in MDB_MAXKEYSIZE); a key that
# long would fail its whole batch, so the stream layer bounds every input a key
# is made of: stream paths (the key itself) and producer ids (after 8 bytes of id).
MAX_KEY_BYTES = 511

TAIL = struct.Struct("<QQQ")  # file length, tail unit, first unit of the log
PRODUCER = struct.Struct("<QQ")  # epoch, last accepted seq
U64_BE = struct.Struct(">Q")
U64 = struct.Struct("<Q")
INDEX_KEY = struct.Struct(">QQ")


@dataclass(slots=True)
class StreamMeta:
    """What is stored per stream path; the JSON form is part of the on-disk format."""

    id: int
    content_type: str
    created_at: float
    ttl: int | None = None
    expires_at: str | None = None  # as the client sent it (RFC 3339)
    expires_at_ts: float | None = None
    closed: bool = False
    closed_by: tuple[str, int, int] | None = None  # producer tuple that closed it
    stream_seq: str | None = None  # last accepted Stream-Seq
    fork_from: str | None = None  # source stream path
    fork_offset: int = 0  # first unit held by this stream's own segment file
    refcount: int = 0  # live forks that read through this stream
    soft_deleted: bool = False
    touched_at: float = 0.0  # last read or write, for sliding TTL
    extra: dict = field(default_factory=dict)  # room for later fields without a format bump

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> StreamMeta:
        data = orjson.loads(raw)
        if data.get("closed_by") is not None:
            data["closed_by"] = tuple(data["closed_by"])
        return cls(**data)


def stream_key(path: str) -> bytes:
    return path.encode("utf-8", "surrogatepass")


def id_key(stream_id: int) -> bytes:
    return U64_BE.pack(stream_id)


def producer_key(stream_id: int, producer_id: str) -> bytes:
    return U64_BE.pack(stream_id) + producer_id.encode("utf-8", "surrogatepass")


def index_key(stream_id: int, unit: int) -> bytes:
    return INDEX_KEY.pack(stream_id, unit)


class Metadata:
    """The LMDB environment and its named databases."""

    def __init__(self, path: Path, map_size: int) -> None:
        fsio.mkdir(path)
        self.path = path
        self.env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=len(DB_NAMES) + 2,
            sync=True,
            metasync=False,
            readahead=False,
            max_readers=256,
        )
        self.dbs = {num: self.env.open_db(name) for num, name in DB_NAMES.items()}

    def grow(self) -> None:
        """Double the map after MapFullError; LMDB allows this between transactions."""
        self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def apply(self, txn: lmdb.Transaction, entries: list[tuple]) -> None:
        """Apply WAL-style metadata entries (PUT / DELETE / DELETE_PREFIX) in order."""
        from stream_server.engine.wal import DELETE, DELETE_PREFIX, PUT

        for entry in entries:
            kind = entry[0]
            if kind == PUT:
                txn.put(entry[2], entry[3], db=self.dbs[entry[1]])
            elif kind == DELETE:
                txn.delete(entry[2], db=self.dbs[entry[1]])
            elif kind == DELETE_PREFIX:
                delete_prefix(txn, self.dbs[entry[1]], entry[2])

    @contextlib.contextmanager
    def write(self) -> Iterator[lmdb.Transaction]:
        """A write transaction; the I/O module hears of its commit."""
        with self.env.begin(write=True) as txn:
            yield txn
        fsio.lmdb_committed(self.path)

    def sync(self) -> None:
        self.env.sync(True)
        fsio.lmdb_synced(self.path)

    def close(self) -> None:
        self.env.close()


def delete_prefix(txn: lmdb.Transaction, db, prefix: bytes, start: bytes | None = None) -> None:
    """Delete every key that starts with ``prefix`` (from ``start`` on, if given)."""
    cur = txn.cursor(db=db)
    if not cur.set_range(start or prefix):
        return
    while cur.key().startswith(prefix):
        if not cur.delete():
            break
        if not cur.key():
            break
