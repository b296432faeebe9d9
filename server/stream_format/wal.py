"""The write-ahead log's frames: one per group-commit batch, encoded and decoded.

A frame carries every change of its batch: the records' bytes as positional
writes into segment files, and the metadata as whole LMDB values (puts,
deletes, prefix deletes). Replaying frames is therefore idempotent. Writing
WAL files is the engine's job (``stream_server.engine.wal``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_format.records import crc32

FRAME_MAGIC = 0x46574453  # "SDWF"
FRAME_HEADER = struct.Struct("<IIIQ")  # magic, body length, crc32(body), lsn

# Entry kinds inside a frame body.
PUT = 1  # db, key, value
DELETE = 2  # db, key
DELETE_PREFIX = 3  # db, prefix
WRITE = 4  # stream id, file position, bytes

_ENTRY_KV = struct.Struct("<BBII")  # kind, db, key length, value length
_ENTRY_WRITE = struct.Struct("<BQQI")  # kind, stream id, position, length

# (PUT, db, key, value) | (DELETE, db, key) | (DELETE_PREFIX, db, prefix)
# | (WRITE, stream id, position, data)
Entry = tuple[Any, ...]


class WalCorrupt(Exception):
    """A frame that is not at the torn end of the last WAL file fails its checksum."""


@dataclass(slots=True)
class Frame:
    lsn: int
    entries: list[Entry]
    end: int  # file position just past the frame


def encode_entries(entries: Iterable[Entry]) -> bytes:
    """A frame body: each entry as its kind's header and bytes, in order."""
    parts: list[bytes | memoryview] = []
    for entry in entries:
        kind = entry[0]
        if kind == WRITE:
            _, sid, pos, data = entry
            parts.append(_ENTRY_WRITE.pack(WRITE, sid, pos, len(data)))
            parts.append(data)
        elif kind == PUT:
            _, db, key, value = entry
            parts.append(_ENTRY_KV.pack(PUT, db, len(key), len(value)))
            parts.append(key)
            parts.append(value)
        else:
            _, db, key = entry
            parts.append(_ENTRY_KV.pack(kind, db, len(key), 0))
            parts.append(key)
    return b"".join(parts)


def encode_frame(lsn: int, entries: Iterable[Entry]) -> bytes:
    body = encode_entries(entries)
    return FRAME_HEADER.pack(FRAME_MAGIC, len(body), crc32(body), lsn) + body


def decode_entries(body: memoryview) -> list[Entry]:
    entries: list[Entry] = []
    off = 0
    n = len(body)
    while off < n:
        kind = body[off]
        if kind == WRITE:
            _, sid, pos, length = _ENTRY_WRITE.unpack_from(body, off)
            off += _ENTRY_WRITE.size
            entries.append((WRITE, sid, pos, body[off : off + length]))
            off += length
        else:
            _, db, klen, vlen = _ENTRY_KV.unpack_from(body, off)
            off += _ENTRY_KV.size
            key = bytes(body[off : off + klen])
            off += klen
            if kind == PUT:
                entries.append((PUT, db, key, bytes(body[off : off + vlen])))
                off += vlen
            elif kind in (DELETE, DELETE_PREFIX):
                entries.append((kind, db, key))
            else:
                raise WalCorrupt(f"unknown WAL entry kind {kind}")
    return entries


def read_frames(path: Path, *, last_file: bool) -> Iterator[Frame]:
    """Yield the whole frames of one WAL file.

    A torn or unchecksummed frame at the end of the newest file is the batch
    that was being written when the process died: it was never acknowledged
    and is dropped. Anywhere else it is corruption.
    """
    data = memoryview(path.read_bytes())
    off = 0
    n = len(data)
    while off < n:
        if off + FRAME_HEADER.size > n:
            if last_file:
                return
            raise WalCorrupt(f"{path}: truncated frame header at {off}")
        magic, length, crc, lsn = FRAME_HEADER.unpack_from(data, off)
        body_start = off + FRAME_HEADER.size
        body = data[body_start : body_start + length]
        if magic != FRAME_MAGIC or len(body) != length or crc32(body) != crc:
            if last_file:
                return
            raise WalCorrupt(f"{path}: bad frame at {off}")
        off = body_start + length
        yield Frame(lsn, decode_entries(body), off)


def wal_files(wal_dir: Path) -> list[Path]:
    return sorted(wal_dir.glob("*.wal"))
