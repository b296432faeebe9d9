"""The object-store archive's layout: object names, the frames object, term histories
and base-backup manifests (docs/backup.md, "The archive's layout").

Written in this package, beside the WAL codec it wraps, so that everything that
reads an archive (the server's restore, a replica cluster following it, the Spark
reader later) reads it through one definition, and none of them needs an S3 client
to decode what it downloaded.

A frames object is immutable and self-checking: a fixed header (magic, version,
term, first and last lsn, frame count, CRC-32 of the rest, CRC-32 of the header),
an index of one (lsn, commit time, length) row per frame, then the WAL frames
exactly as the engine wrote them (``stream_format.wal``), each with its own
checksum. The commit times are what a restore to a time stops at.
"""

from __future__ import annotations

import itertools
import json
import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stream_format.layout import FormatError
from stream_format.records import crc32
from stream_format.wal import FRAME_HEADER, FRAME_MAGIC

ARCHIVE_FORMAT = 1  # of everything below: names, the frames object, manifests, histories

WAL_PREFIX = "wal/"
HISTORY_PREFIX = "history/"
BACKUPS_PREFIX = "backups/"
MANIFEST_NAME = "manifest.json"

OBJECT_MAGIC = b"DSARCWAL"
# magic, version, frame count, term, first lsn, last lsn, crc32(index + frames)
_HEADER_BODY = struct.Struct("<8sHIQQQI")
_HEADER_CRC = struct.Struct("<I")  # crc32 of the header's other bytes
HEADER_SIZE = _HEADER_BODY.size + _HEADER_CRC.size
INDEX_ROW = struct.Struct("<QQI")  # lsn, commit time (µs since the epoch), frame length

_S3_URL = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?")


class ArchiveDamaged(FormatError):
    """An archive object that does not check: truncated, altered, or not ours. Its
    message names the object."""


# ------------------------------------------------------------------ locations


@dataclass(frozen=True)
class ArchiveLocation:
    """Where an archive lives: a bucket and a key prefix ("" or ending in "/")."""

    bucket: str
    prefix: str

    @staticmethod
    def parse(url: str) -> ArchiveLocation:
        """``s3://BUCKET`` or ``s3://BUCKET/PREFIX``; ValueError naming what is wrong."""
        m = _S3_URL.fullmatch(url)
        if m is None:
            raise ValueError(
                f"{url!r} is not s3://BUCKET/PREFIX (a bucket name of 3 to 63 lower-case "
                "letters, digits, dots and hyphens)"
            )
        prefix = (m.group(2) or "").rstrip("/")
        if "//" in url[len("s3://") :].rstrip("/") or prefix.startswith("/"):
            raise ValueError(f"{url!r} has an empty path segment")
        return ArchiveLocation(m.group(1), prefix + "/" if prefix else "")

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, name: str) -> str:
        """The object key of ``name`` (a name below the prefix, as built here)."""
        return self.prefix + name


def wal_name(term: int, first_lsn: int) -> str:
    return f"{WAL_PREFIX}{term:016x}-{first_lsn:016x}"


def parse_wal_name(name: str) -> tuple[int, int]:
    """(term, first lsn) of a frames object's name (below the prefix)."""
    rest = name[len(WAL_PREFIX) :] if name.startswith(WAL_PREFIX) else ""
    parts = rest.split("-")
    if len(parts) != 2 or not all(len(p) == 16 for p in parts):
        raise ArchiveDamaged(f"{name!r} is not the name of an archived frames object")
    try:
        return int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        raise ArchiveDamaged(f"{name!r} is not the name of an archived frames object") from None


def history_name(term: int) -> str:
    return f"{HISTORY_PREFIX}{term:016x}.json"


_BACKUP_TIME = "%Y%m%dT%H%M%SZ"  # a backup id begins with its UTC time: ids sort by time


def backup_id(seconds: float, lsn: int) -> str:
    """``<UTC time>-<lsn:016x>``: the id of a backup taken at ``seconds`` at ``lsn``."""
    return f"{datetime.fromtimestamp(seconds, UTC).strftime(_BACKUP_TIME)}-{lsn:016x}"


def backup_id_time(backup_id: str) -> float:
    """The time (seconds since the epoch) a backup id begins with; ValueError when it
    is not one of ``backup_id``'s."""
    stamp = backup_id.partition("-")[0]
    return datetime.strptime(stamp, _BACKUP_TIME).replace(tzinfo=UTC).timestamp()


def rfc3339(seconds: float) -> str:
    """The archive's way to write a time (manifests, listings): UTC, milliseconds, ``Z``."""
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def parse_time(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (``Z`` or an offset; ValueError)."""
    when = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (end it with Z or +HH:MM)")
    return when.timestamp()


def backup_prefix(backup_id: str) -> str:
    return f"{BACKUPS_PREFIX}{backup_id}/"


def manifest_name(backup_id: str) -> str:
    return backup_prefix(backup_id) + MANIFEST_NAME


def part_name(backup_id: str, number: int) -> str:
    return f"{backup_prefix(backup_id)}part-{number:06d}"


# ------------------------------------------------------------------ frames objects


@dataclass(frozen=True)
class ArchivedFrame:
    lsn: int
    time_us: int  # when the primary made it durable (µs since the epoch)
    frame: bytes  # the WAL frame as the engine wrote it


@dataclass(frozen=True)
class FramesObject:
    term: int
    first_lsn: int
    last_lsn: int
    frames: list[ArchivedFrame]


def encode_frames_object(term: int, frames: list[ArchivedFrame]) -> bytes:
    """One frames object of ``frames`` (ascending, consecutive lsns) of ``term``."""
    if not frames:
        raise ValueError("a frames object holds at least one frame")
    for before, after in itertools.pairwise(frames):
        if after.lsn != before.lsn + 1:
            raise ValueError(f"frames {before.lsn} and {after.lsn} are not consecutive")
    index = b"".join(INDEX_ROW.pack(f.lsn, f.time_us, len(f.frame)) for f in frames)
    rest = index + b"".join(f.frame for f in frames)
    head = _HEADER_BODY.pack(
        OBJECT_MAGIC,
        ARCHIVE_FORMAT,
        len(frames),
        term,
        frames[0].lsn,
        frames[-1].lsn,
        crc32(rest),
    )
    return head + _HEADER_CRC.pack(crc32(head)) + rest


def decode_header(name: str, data: bytes) -> tuple[int, int, int, int, int]:
    """(term, first lsn, last lsn, count, crc of the rest) from an object's first
    ``HEADER_SIZE`` bytes, checked; ArchiveDamaged naming ``name`` otherwise."""
    if len(data) < HEADER_SIZE:
        raise ArchiveDamaged(f"archive object {name}: truncated ({len(data)} bytes)")
    body = data[: _HEADER_BODY.size]
    (want,) = _HEADER_CRC.unpack_from(data, _HEADER_BODY.size)
    magic, version, count, term, first, last, rest_crc = _HEADER_BODY.unpack(body)
    if magic != OBJECT_MAGIC:
        raise ArchiveDamaged(f"archive object {name}: not a frames object (magic {magic!r})")
    if crc32(body) != want:
        raise ArchiveDamaged(f"archive object {name}: header checksum mismatch")
    if version != ARCHIVE_FORMAT:
        raise ArchiveDamaged(
            f"archive object {name}: archive format {version}, this program reads {ARCHIVE_FORMAT}"
        )
    if count != last - first + 1:
        raise ArchiveDamaged(f"archive object {name}: {count} frames for lsns {first}..{last}")
    return term, first, last, count, rest_crc


def decode_frames_object(name: str, data: bytes) -> FramesObject:
    """The frames of an object, every checksum checked; ArchiveDamaged naming ``name``
    for any damage (a restore must never replay a frame it cannot trust)."""
    term, first, last, count, rest_crc = decode_header(name, data)
    rest = memoryview(data)[HEADER_SIZE:]
    if crc32(rest) != rest_crc:
        raise ArchiveDamaged(f"archive object {name}: checksum mismatch (altered or truncated)")
    pos = count * INDEX_ROW.size
    frames: list[ArchivedFrame] = []
    for i in range(count):
        lsn, time_us, length = INDEX_ROW.unpack_from(rest, i * INDEX_ROW.size)
        frame = bytes(rest[pos : pos + length])
        pos += length
        if lsn != first + i or len(frame) != length or not _frame_checks(frame, lsn):
            raise ArchiveDamaged(f"archive object {name}: frame {first + i} does not check")
        frames.append(ArchivedFrame(lsn, time_us, frame))
    if pos != len(rest):
        raise ArchiveDamaged(f"archive object {name}: {len(rest) - pos} bytes after its frames")
    return FramesObject(term, first, last, frames)


def _frame_checks(frame: bytes, lsn: int) -> bool:
    if len(frame) < FRAME_HEADER.size:
        return False
    magic, length, crc, frame_lsn = FRAME_HEADER.unpack_from(frame)
    body = memoryview(frame)[FRAME_HEADER.size :]
    return bool(
        magic == FRAME_MAGIC and length == len(body) and frame_lsn == lsn and crc32(body) == crc
    )


# ------------------------------------------------------------------ term histories

History = list[tuple[int, int]]  # (term, first lsn), oldest first
# A single node's frames: term 0 from lsn 1 (the history of an archive without a
# history object, and of a directory that never was a set's or followed one).
SINGLE_NODE_HISTORY: History = [(0, 1)]


def encode_history(term: int, history: History) -> bytes:
    if not history or history[-1][0] != term:
        raise ValueError(f"the history of term {term} must end with it: {history}")
    return json.dumps({"format": ARCHIVE_FORMAT, "term": term, "history": history}).encode()


def decode_history(name: str, data: bytes) -> History:
    try:
        doc = json.loads(data)
        history = [(int(t), int(lsn)) for t, lsn in doc["history"]]
        term = int(doc["term"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ArchiveDamaged(f"archive object {name}: not a term history ({exc})") from None
    if not history or history[-1][0] != term:
        raise ArchiveDamaged(f"archive object {name}: the history does not end with term {term}")
    return history


def term_of(history: History, lsn: int) -> int:
    """The term that wrote ``lsn`` along ``history`` (the last term begun at or
    before it)."""
    term = history[0][0]
    for t, first in history:
        if first <= lsn:
            term = t
    return term


def history_ranges(history: History, last_lsn: int) -> list[tuple[int, int, int]]:
    """(term, first lsn, last lsn) of each term along ``history`` up to ``last_lsn``:
    the frames a restore takes from each term, in order."""
    out: list[tuple[int, int, int]] = []
    for i, (term, first) in enumerate(history):
        end = history[i + 1][1] - 1 if i + 1 < len(history) else last_lsn
        end = min(end, last_lsn)
        if end >= first:
            out.append((term, first, end))
    return out


# ------------------------------------------------------------------ manifests


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    return json.dumps({"format": ARCHIVE_FORMAT, **manifest}, indent=1, sort_keys=True).encode()


MANIFEST_FIELDS = ("id", "term", "start_lsn", "end_lsn", "time", "parts", "files")


def decode_manifest(name: str, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ArchiveDamaged(f"archive object {name}: not a backup manifest ({exc})") from None
    if not isinstance(doc, dict):
        raise ArchiveDamaged(f"archive object {name}: not a backup manifest")
    missing = [f for f in MANIFEST_FIELDS if f not in doc]
    if missing:
        raise ArchiveDamaged(f"archive object {name}: a manifest without {', '.join(missing)}")
    if doc.get("format") != ARCHIVE_FORMAT:
        raise ArchiveDamaged(
            f"archive object {name}: archive format {doc.get('format')}, this program reads "
            f"{ARCHIVE_FORMAT}"
        )
    return doc
