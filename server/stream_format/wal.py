"""The write-ahead log: a file header, and frames, one per group-commit batch.

A frame carries every change of its batch: the records' bytes as positional
writes into segment files, and the metadata as whole LMDB values (puts,
deletes, prefix deletes). Replaying frames is therefore idempotent. Writing
WAL files is the engine's job (``stream_server.engine.wal_writer``).

Since data format 2 a WAL file starts with a header (magic, WAL version, the
file's number, checksum), so that a file this program does not understand,
or one renamed out of its place in the order, is refused by name instead of
read as a torn last frame and silently dropped. Format 1's files have no
header; they are read only in format-1 directories (``headerless=True``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_format.layout import FormatError
from stream_format.meta import ALL_DB_NAMES
from stream_format.records import crc32

FRAME_MAGIC = 0x46574453  # "SDWF"
FRAME_HEADER = struct.Struct("<IIIQ")  # magic, body length, crc32(body), lsn

FILE_MAGIC = b"DSWAL\x00"
WAL_VERSION = 2  # of the file layout; 1 is format 1's headerless files
FILE_HEADER = struct.Struct("<6sHQI")  # magic, version, file number, crc32(bytes 0 .. 16)
HEADER_SIZE = FILE_HEADER.size  # 20
_FRAME_MAGIC_BYTES = struct.pack("<I", FRAME_MAGIC)

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


class WalCorrupt(FormatError):
    """A WAL file that cannot be replayed: not a WAL file, a version this program does
    not know, or a frame that fails its checksum other than at the torn end of the
    newest file. Recovery stops: skipping it could lose acknowledged writes."""


@dataclass(slots=True)
class Frame:
    lsn: int
    entries: list[Entry]
    end: int  # file position just past the frame
    raw: memoryview  # the frame as stored, header included: what a primary ships


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


def decode_frame(frame: bytes | memoryview) -> tuple[int, list[Entry]]:
    """One whole frame (as ``encode_frame`` made it, or as a primary ships it): its
    lsn and entries. WalCorrupt when its header or checksum does not hold or bytes
    follow it: a frame received whole is never torn, so any damage is corruption."""
    view = memoryview(frame)
    if len(view) < FRAME_HEADER.size:
        raise WalCorrupt(f"a frame of {len(view)} bytes is shorter than its header")
    magic, length, crc, lsn = FRAME_HEADER.unpack_from(view)
    body = view[FRAME_HEADER.size :]
    if magic != FRAME_MAGIC or len(body) != length or crc32(body) != crc:
        raise WalCorrupt(f"frame {lsn} is damaged")
    return lsn, decode_entries(body)


def decode_entries(body: memoryview) -> list[Entry]:
    """A frame body's entries; WalCorrupt for an entry kind or a database number this
    program does not know, or an entry that runs past the body: the frame's checksum
    held, so it is a newer (or broken) writer's, and guessing could lose state."""
    entries: list[Entry] = []
    off = 0
    n = len(body)
    while off < n:
        kind = body[off]
        if kind == WRITE:
            if off + _ENTRY_WRITE.size > n:
                raise WalCorrupt(f"WAL entry at {off} runs past its frame")
            _, sid, pos, length = _ENTRY_WRITE.unpack_from(body, off)
            off += _ENTRY_WRITE.size
            entries.append((WRITE, sid, pos, body[off : off + length]))
            off += length
        elif kind in (PUT, DELETE, DELETE_PREFIX):
            if off + _ENTRY_KV.size > n:
                raise WalCorrupt(f"WAL entry at {off} runs past its frame")
            _, db, klen, vlen = _ENTRY_KV.unpack_from(body, off)
            if db not in ALL_DB_NAMES:
                raise WalCorrupt(f"unknown database number {db} in a WAL entry")
            off += _ENTRY_KV.size
            key = bytes(body[off : off + klen])
            off += klen
            if kind == PUT:
                entries.append((PUT, db, key, bytes(body[off : off + vlen])))
                off += vlen
            else:
                entries.append((kind, db, key))
        else:
            raise WalCorrupt(f"unknown WAL entry kind {kind}")
        if off > n:
            raise WalCorrupt("a WAL entry runs past its frame")
    return entries


def file_number(path: Path) -> int:
    """The number in a WAL file's name: files are replayed in this order."""
    try:
        return int(path.stem)
    except ValueError:
        raise WalCorrupt(f"{path}: not a WAL file name (16 decimal digits)") from None


def encode_header(number: int) -> bytes:
    head = FILE_HEADER.pack(FILE_MAGIC, WAL_VERSION, number, 0)[:16]
    return head + struct.pack("<I", crc32(head))


def check_header(path: Path, head: bytes, *, headerless: bool = False) -> bool:
    """Whether frames follow a valid header; WalCorrupt if the file is not replayable.

    False means the header was never written: the file is shorter than a
    header and holds a beginning of it (or nothing), or its header is zeros.
    The writer flushes the header before the file's first frame, so such a
    file held no acknowledged frame; the caller must still see that no bytes
    follow (``read_frames`` does). ``head`` is the file's first HEADER_SIZE
    bytes (fewer if it is shorter). ``headerless``: a format-1 directory,
    whose files start with a frame; there a file with a header is refused.
    """
    if headerless:
        _check_headerless(path, head)
        return True
    number = file_number(path)
    if len(head) < HEADER_SIZE:
        if not any(head) or head == encode_header(number)[: len(head)]:
            return False
        raise WalCorrupt(f"{path}: incomplete WAL file header {head.hex()}")
    if not any(head):
        return False
    magic, version, named, crc = FILE_HEADER.unpack(head[:HEADER_SIZE])
    if magic != FILE_MAGIC:
        if head.startswith(_FRAME_MAGIC_BYTES):
            raise WalCorrupt(
                f"{path}: a headerless WAL file of data format 1 in a directory of "
                "format 2 or later"
            )
        raise WalCorrupt(f"{path}: not a WAL file (magic {head[:6].hex()})")
    # The magic and the version keep their places in every version; the rest may not.
    if version != WAL_VERSION:
        newer = "is newer than" if version > WAL_VERSION else "is not"
        raise WalCorrupt(
            f"{path}: WAL file version {version} {newer} the version this program "
            f"reads ({WAL_VERSION})"
        )
    if crc != crc32(head[:16]):
        raise WalCorrupt(f"{path}: WAL file header fails its checksum")
    if named != number:
        raise WalCorrupt(f"{path}: the header names WAL file {named}, not {number}")
    return True


def _check_headerless(path: Path, head: bytes) -> None:
    """A format-1 directory's file starts with a frame, never with a header."""
    if head.startswith(FILE_MAGIC):
        raise WalCorrupt(
            f"{path}: a WAL file with a format-2 header in a format-1 directory; "
            "its FORMAT file was changed or the file was copied in"
        )


def check_file(path: Path, *, headerless: bool = False) -> None:
    """WalCorrupt unless the file's header is one recovery can replay: cheap (one
    small read), so that a server refuses the directory before it starts."""
    with open(path, "rb") as f:
        if not check_header(path, f.read(HEADER_SIZE), headerless=headerless):
            _never_written(path, f.read())


def _never_written(path: Path, rest: bytes | memoryview) -> None:
    """A header that was never written had no frame after it: the rest is zeros."""
    if bytes(rest).strip(b"\x00"):
        raise WalCorrupt(f"{path}: bytes follow a WAL file header that was never written")


def read_frames(path: Path, *, last_file: bool, headerless: bool = False) -> Iterator[Frame]:
    """Yield the whole frames of one WAL file, after checking its header.

    A torn or unchecksummed frame at the end of the newest file is the batch
    that was being written when the process died: it was never acknowledged
    and is dropped. Anywhere else it is corruption. A file whose header was
    never written holds nothing (``check_header``). ``headerless``: the file
    is format 1's, frames from its first byte.
    """
    data = memoryview(path.read_bytes())
    n = len(data)
    if not check_header(path, bytes(data[:HEADER_SIZE]), headerless=headerless):
        _never_written(path, data[HEADER_SIZE:])
        return
    off = 0 if headerless else HEADER_SIZE
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
        try:
            entries = decode_entries(body)
        except WalCorrupt as exc:
            raise WalCorrupt(f"{path}: frame at {body_start - FRAME_HEADER.size}: {exc}") from None
        yield Frame(lsn, entries, off, data[body_start - FRAME_HEADER.size : off])


def wal_files(wal_dir: Path) -> list[Path]:
    return sorted(wal_dir.glob("*.wal"))
