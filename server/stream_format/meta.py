"""The LMDB side of the format: database numbers, keys, fixed-size values, stream metadata.

See docs/storage-format.md. Values are decoded explicitly, field by field, so
that renaming an attribute can never silently change what is on disk, and
stream metadata ignores fields it does not know (a newer writer may add them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from stream_format.records import FILE_HEADER_SIZE

# Database numbers as they appear in WAL frames.
DB_INFO = 0
DB_STREAMS = 1  # stream path (utf-8) -> StreamMeta (JSON)
DB_TAILS = 2  # stream id (u64 BE) -> TAIL
DB_PRODUCERS = 3  # stream id (u64 BE) + producer id (utf-8) -> PRODUCER
DB_INDEX = 4  # stream id (u64 BE) + unit (u64 BE) -> file position (u64 LE)
# Keyed values: space (utf-8) + 0x00 + key (utf-8) -> opaque value (since format 3). The
# database keeps the name format 3 gave it, ``records``; it holds no log record.
DB_RECORDS = 5
# Small streams' logs (since format 5): stream id (u64 BE) -> the bytes its segment file
# would hold (file header, then records), for a stream that has no segment file.
DB_INLINE = 6

# The stream databases: every format has them, and a reader of committed data
# (read version 1, the Spark data source) opens these and no others.
DB_NAMES = {
    DB_INFO: b"info",
    DB_STREAMS: b"streams",
    DB_TAILS: b"tails",
    DB_PRODUCERS: b"producers",
    DB_INDEX: b"index",
}
# Every database a writer keeps. Format 3 adds ``records`` (keyed values: state of
# other parts of the server, such as subscriptions); readers never open it, so it did
# not raise the read version.
# Format 5 adds ``inline``: a reader of committed data must open it (read version 3).
ALL_DB_NAMES = {**DB_NAMES, DB_RECORDS: b"records", DB_INLINE: b"inline"}

KEY_NEXT_STREAM_ID = b"next_stream_id"

# LMDB refuses keys longer than this (its compiled-in MDB_MAXKEYSIZE); a key that
# long would fail its whole batch, so the stream layer bounds every input a key
# is made of: stream paths (the key itself) and producer ids (after 8 bytes of id).
MAX_KEY_BYTES = 511

TAIL = struct.Struct("<QQQ")  # file length, tail unit, first unit of the log
# Format 4: the same three, then the retained start (first unit kept, and the file
# position of the record that starts there). Written only once retention has
# dropped something; a 24-byte value means "nothing dropped" (start = first unit,
# at the first record, just past the file header).
TAIL_RETAINED = struct.Struct("<QQQQQ")
PRODUCER = struct.Struct("<QQ")  # epoch, last accepted seq
U64_BE = struct.Struct(">Q")
U64 = struct.Struct("<Q")
INDEX_KEY = struct.Struct(">QQ")


class TailValue(NamedTuple):
    """A stream's ``tails`` value: where its log ends and where its retained data starts."""

    file_len: int  # committed file length
    unit: int  # tail unit
    base: int  # first unit of this stream's own log (its fork offset, or 0)
    start: int  # first retained unit (>= base; = base until retention drops data)
    start_pos: int  # file position of the record that starts at ``start``


def encode_tail(t: TailValue) -> bytes:
    """The short (formats 1-3) value while nothing was dropped, else the format-4 one."""
    return encode_tail_fields(*t)


def encode_tail_fields(file_len: int, unit: int, base: int, start: int, start_pos: int) -> bytes:
    """``encode_tail`` of the five fields, with no tuple made: the writer encodes one
    per stream of every batch."""
    if start == base and start_pos == FILE_HEADER_SIZE:
        return TAIL.pack(file_len, unit, base)
    return TAIL_RETAINED.pack(file_len, unit, base, start, start_pos)


def decode_tail(raw: bytes | memoryview) -> TailValue:
    """Either form; ValueError for any other length (a newer writer's)."""
    if len(raw) == TAIL.size:
        file_len, unit, base = TAIL.unpack(raw)
        return TailValue(file_len, unit, base, base, FILE_HEADER_SIZE)
    if len(raw) == TAIL_RETAINED.size:
        return TailValue(*TAIL_RETAINED.unpack(raw))
    raise ValueError(f"a tails value of {len(raw)} bytes is not one this program reads")


@dataclass(slots=True)
class StreamMeta:
    """What is stored per stream path; ``to_json`` is its on-disk form."""

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
    extra: dict[str, Any] = field(default_factory=dict)  # room for later fields

    def to_json(self) -> bytes:
        """The fields that differ from their defaults (format 5; ``from_json`` has always
        read a missing field as its default): most streams set none of the others,
        and a million of them kept every one spelled out as null, false or 0."""
        d: dict[str, Any] = {
            "id": self.id,
            "content_type": self.content_type,
            "created_at": self.created_at,
        }
        for name, value, default in (
            ("ttl", self.ttl, None),
            ("expires_at", self.expires_at, None),
            ("expires_at_ts", self.expires_at_ts, None),
            ("closed", self.closed, False),
            ("closed_by", list(self.closed_by) if self.closed_by is not None else None, None),
            ("stream_seq", self.stream_seq, None),
            ("fork_from", self.fork_from, None),
            ("fork_offset", self.fork_offset, 0),
            ("refcount", self.refcount, 0),
            ("soft_deleted", self.soft_deleted, False),
            ("touched_at", self.touched_at, 0.0),
            ("extra", self.extra, {}),
        ):
            if value != default:
                d[name] = value
        return orjson.dumps(d)

    @classmethod
    def from_json(cls, raw: bytes | memoryview) -> StreamMeta:
        """Decode, ignoring fields this version does not know."""
        d = orjson.loads(bytes(raw))
        closed_by = d.get("closed_by")
        return cls(
            id=d["id"],
            content_type=d["content_type"],
            created_at=d["created_at"],
            ttl=d.get("ttl"),
            expires_at=d.get("expires_at"),
            expires_at_ts=d.get("expires_at_ts"),
            closed=d.get("closed", False),
            closed_by=(str(closed_by[0]), int(closed_by[1]), int(closed_by[2]))
            if closed_by
            else None,
            stream_seq=d.get("stream_seq"),
            fork_from=d.get("fork_from"),
            fork_offset=d.get("fork_offset", 0),
            refcount=d.get("refcount", 0),
            soft_deleted=d.get("soft_deleted", False),
            touched_at=d.get("touched_at", 0.0),
            extra=d.get("extra") or {},
        )

    def expired(self, now: float) -> bool:
        """Past its Expires-At, or idle for longer than its TTL (sliding)."""
        if self.expires_at_ts is not None and now >= self.expires_at_ts:
            return True
        return self.ttl is not None and now >= self.touched_at + self.ttl


def stream_key(path: str) -> bytes:
    return path.encode("utf-8", "surrogatepass")


def stream_path(key: bytes | memoryview) -> str:
    return bytes(key).decode("utf-8", "surrogatepass")


def id_key(stream_id: int) -> bytes:
    return U64_BE.pack(stream_id)


def producer_key(stream_id: int, producer_id: str) -> bytes:
    return U64_BE.pack(stream_id) + producer_id.encode("utf-8", "surrogatepass")


def key_stream_id(key: bytes | memoryview) -> int:
    """The stream id a ``tails``, ``producers`` or ``index`` key starts with: the
    inverse of ``id_key`` (the first 8 bytes of the others)."""
    return int(U64_BE.unpack_from(key)[0])


def key_producer(key: bytes | memoryview) -> tuple[int, str]:
    """(stream id, producer id) of a ``producers`` key: the inverse of ``producer_key``."""
    return key_stream_id(key), bytes(key[U64_BE.size :]).decode("utf-8", "surrogatepass")


def index_key(stream_id: int, unit: int) -> bytes:
    return INDEX_KEY.pack(stream_id, unit)


def key_index(key: bytes | memoryview) -> tuple[int, int]:
    """(stream id, unit) of an ``index`` key: the inverse of ``index_key``."""
    stream_id, unit = INDEX_KEY.unpack(key)
    return int(stream_id), int(unit)


SPACE_SEP = b"\x00"  # between a keyed value's space and its key; never inside a space


def space_prefix(space: str) -> bytes:
    """The key prefix every keyed value of ``space`` shares (the space may not hold NUL)."""
    return space.encode("utf-8") + SPACE_SEP


def space_key(space: str, key: str) -> bytes:
    """The LMDB key that ``key`` of ``space`` is kept under in the ``records`` database."""
    return space_prefix(space) + key.encode("utf-8")


def key_in_space(raw: bytes | memoryview, prefix: bytes) -> str:
    """The key of a keyed value within its space, from its LMDB key (``space_key``'s inverse)."""
    return bytes(raw)[len(prefix) :].decode("utf-8")
