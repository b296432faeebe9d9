"""Reading a data directory from outside the server: a consistent cut, then records.

Pure format code over docs/storage-format.md (format version 1), no Spark:
the planner and the record reader are used by the data source on the driver
and on the workers, and are tested without a JVM.

The rules that make an outside read safe while a server keeps writing:

- the stream list and every committed tail come from one LMDB read
  transaction (a *cut*); LMDB is opened ``readonly=True, lock=False`` so a
  read-only mount works, and transactions stay short because an unlocked
  reader does not stop the writer from reusing pages;
- a small stream's log kept in LMDB (format 5's ``inline`` database) is copied
  out in the cut's own transaction, so it is exactly the cut's;
- segment files are read up to the committed file length of the cut only:
  bytes past it belong to no acknowledged write, and records below it are
  never rewritten, so reading later than the cut still returns the cut;
- a record that fails its checksum, or ends before a committed length, is an
  error, never a silently short answer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lmdb

from stream_format import chain, index
from stream_format.layout import LMDB_DATA, FormatError, Layout
from stream_format.media import record_kind
from stream_format.meta import (
    DB_INDEX,
    DB_INLINE,
    DB_NAMES,
    DB_STREAMS,
    DB_TAILS,
    U64,
    StreamMeta,
    decode_tail,
    id_key,
    index_key,
    key_index,
    key_stream_id,
    stream_path,
)
from stream_format.records import (
    FILE_HEADER_SIZE,
    KIND_JSON,
    CorruptRecord,
    Producer,
    Record,
    check_file_header,
    iter_records,
    record_size,
)

__all__ = ["KIND_JSON", "FormatError", "Producer"]  # with the names defined below

READ_CHUNK = 8 * 1024 * 1024
INDEX_BATCH = 4096  # index entries per read transaction (about 64 MiB of segment file)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream as the cut saw it: configuration and committed tail."""

    path: str
    id: int
    content_type: str
    tail: int  # committed tail unit
    file_len: int  # committed length of the stream's own segment file
    base: int  # first unit of the stream's own segment file
    closed: bool
    soft_deleted: bool
    expired: bool
    fork_from: str | None
    fork_offset: int
    created_at: float
    start: int = -1  # first retained unit of its own file (format 4; -1: ``base``)
    start_pos: int = FILE_HEADER_SIZE  # file position of the record at ``start``
    inline: bytes | None = None  # its log as the cut holds it, when kept in LMDB (format 5)

    @property
    def kind(self) -> int:
        return record_kind(self.content_type)

    @property
    def is_json(self) -> bool:
        return self.kind == KIND_JSON


@dataclass(frozen=True, slots=True)
class Piece:
    """Units ``[lo, hi)`` of a stream, held by the segment file of ``owner``."""

    owner: StreamInfo
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Cut:
    """Every stream and committed tail from one LMDB read transaction."""

    data_dir: str
    taken_at: float
    streams: dict[str, StreamInfo]

    def earliest(self, path: str) -> int:
        """The first unit of ``path`` still held (retention, data format 4): its own
        retained start, or, for a fork whose own file was never trimmed, its source's."""
        info = self.streams[path]
        own = info.base if info.start < 0 else info.start
        if own > info.fork_offset or info.fork_from is None or info.fork_from not in self.streams:
            return own
        return min(self.earliest(info.fork_from), info.fork_offset)

    def chain(self, path: str, lo: int, hi: int) -> list[Piece]:
        """The pieces that make up ``path`` in ``[lo, hi)``, oldest first.

        The server's stitching (``stream_format.chain``): pieces are cut at fork
        offsets exactly, so a sub-offset fork returns the inherited part of a
        source record only.
        """
        try:
            found = chain.pieces(self.streams[path], lo, hi, _fork_fields, self.streams.get)
        except chain.BrokenChain as exc:
            raise FormatError(f"stream {path!r}: {exc}") from None
        return [Piece(owner, a, b) for owner, a, b in found]


def check_layout(data_dir: str | Path) -> Layout:
    """The directory's layout, or FormatError unless this reader knows its read version.

    Only the read version matters: the reader never touches the WAL, so a directory
    a newer server writes (format 2's WAL file headers, say) reads the same.
    """
    layout = Layout(Path(data_dir))
    layout.check_version()  # as a reader: the read version
    if not (layout.meta / LMDB_DATA).exists():
        raise FormatError(f"{layout.meta}: no LMDB environment")
    return layout


def _fork_fields(info: StreamInfo) -> StreamInfo:
    return info  # a StreamInfo carries fork_from and fork_offset itself


class MetaReader:
    """The LMDB environment of a data directory, opened read-only without locks.

    Used as a context manager: open, a few short read transactions, close.
    Never kept on an object that Spark pickles.
    """

    def __init__(self, data_dir: str | Path) -> None:
        self.layout = check_layout(data_dir)
        names = dict(DB_NAMES)
        if self.layout.check_version().read >= 3:  # format 5: small logs in LMDB
            names[DB_INLINE] = b"inline"
        self.env = lmdb.open(
            str(self.layout.meta),
            readonly=True,
            lock=False,
            max_dbs=len(names) + 2,
            readahead=False,
            subdir=True,
        )
        try:
            self.dbs = {num: self.env.open_db(name, create=False) for num, name in names.items()}
        except lmdb.Error as exc:
            self.env.close()
            raise FormatError(f"{self.layout.meta}: missing LMDB database: {exc}") from None

    def __enter__(self) -> MetaReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.env.close()

    def _begin(self) -> lmdb.Transaction:
        """A read transaction; adopts the map size if the server grew it meanwhile."""
        try:
            return self.env.begin(buffers=False)
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)
            return self.env.begin(buffers=False)

    def cut(self, now: float | None = None) -> Cut:
        """Streams and committed tails from one read transaction.

        The transaction only copies raw values out; decoding happens after it
        ends, so that it stays as short as the number of streams allows.
        """
        now = time.time() if now is None else now
        with self._begin() as txn:
            raw_streams = list(txn.cursor(db=self.dbs[DB_STREAMS]))
            raw_tails = list(txn.cursor(db=self.dbs[DB_TAILS]))
            inline_db = self.dbs.get(DB_INLINE)
            raw_inline = list(txn.cursor(db=inline_db)) if inline_db is not None else []
        tails = {key_stream_id(key): decode_tail(value) for key, value in raw_tails}
        inline = {key_stream_id(key): bytes(value) for key, value in raw_inline}
        streams: dict[str, StreamInfo] = {}
        for key, value in raw_streams:
            path = stream_path(key)
            m = StreamMeta.from_json(value)
            tail = tails.get(m.id)
            if tail is None:  # no log (cannot happen in a committed cut): nothing to read
                continue
            file_len, unit, base, start, start_pos = tail
            streams[path] = StreamInfo(
                path=path,
                id=m.id,
                content_type=m.content_type,
                tail=unit,
                file_len=file_len,
                base=base,
                closed=m.closed,
                soft_deleted=m.soft_deleted,
                expired=m.expired(now),
                fork_from=m.fork_from,
                fork_offset=m.fork_offset,
                created_at=m.created_at,
                start=start,
                start_pos=start_pos,
                inline=inline.get(m.id),
            )
        return Cut(str(self.layout.root), now, streams)

    def retained_start_pos(self, stream_id: int) -> int | None:
        """The file position of the stream's retained start now (None: no such stream)."""
        with self._begin() as txn:
            raw = txn.get(id_key(stream_id), db=self.dbs[DB_TAILS])
        return decode_tail(raw).start_pos if raw is not None else None

    def index_floor(self, owner: StreamInfo, unit: int) -> tuple[int, int]:
        """(file position, unit) of the last indexed record start at or before ``unit``."""
        with self._begin() as txn:
            return index.floor(
                txn,
                self.dbs[DB_INDEX],
                owner.id,
                unit,
                owner.base,
                first=(owner.start_pos, owner.base if owner.start < 0 else owner.start),
            )

    def boundaries(self, owner: StreamInfo, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """Indexed record starts (unit, file position) with ``lo < unit < hi``, in order.

        About one per 16 KiB of segment file: the places where a long piece can
        be split into partitions (or a trigger can stop) without cutting a record.
        Read in batches, one short transaction each: entries below a committed
        tail never change, so the batches join up exactly.
        """
        start = index_key(owner.id, lo + 1)
        while True:
            batch: list[tuple[bytes, bytes]] = []
            with self._begin() as txn:
                cur = txn.cursor(db=self.dbs[DB_INDEX])
                if cur.set_range(start):
                    for key, value in cur:
                        # Bytes already (no buffers=True): bytes() returns them as they are.
                        batch.append((bytes(key), bytes(value)))
                        if len(batch) >= INDEX_BATCH:
                            break
            for key, value in batch:
                stream_id, unit = key_index(key)
                if stream_id != owner.id or unit >= hi:
                    return
                pos = U64.unpack(value)[0]
                if pos < owner.file_len:
                    yield unit, pos
            if len(batch) < INDEX_BATCH:
                return
            start = batch[-1][0] + b"\x00"


@dataclass(frozen=True, slots=True)
class Slice:
    """A unit of work for one task: rows of one stream from one segment file.

    Records of ``origin``'s file are scanned from ``pos`` (a record start at or
    before the first wanted unit) and never past ``end_pos`` (the committed
    length in the cut). A record is a row when its first unit clipped to
    ``[lo, hi)`` falls in ``[first, last)``; its payload is clipped to
    ``[lo, hi)``, which cuts a record only at a fork offset or a requested
    start offset, exactly as the protocol's read does.
    """

    stream: str
    origin: str
    content_type: str
    kind: int
    segment: str  # path of the origin's segment file, relative to the data directory
    inline: bytes | None  # or the origin's log itself, kept in LMDB (format 5)
    pos: int
    end_pos: int
    first: int
    last: int
    lo: int
    hi: int
    size: int  # estimated bytes, for packing


@dataclass(slots=True)
class Row:
    """One record as read: units ``[start, stop)`` of ``slice.stream``."""

    start: int
    stop: int
    timestamp_us: int
    producer: Producer | None
    payload: bytes | memoryview


def _retained_start_pos(data_dir: str | Path, sl: Slice) -> int | None:
    """Where the slice's file starts now, if retention moved it past what the cut saw;
    None when that cannot be known here (LMDB refuses a second handle on the same
    environment in one process: then the damage stands, as before format 4)."""
    try:
        with MetaReader(data_dir) as meta:
            return meta.retained_start_pos(int(Path(sl.segment).stem, 16))
    except (lmdb.Error, FormatError):
        return None


def read_slice(
    data_dir: str | Path,
    sl: Slice,
    *,
    verify: bool = True,
    time_from_us: int | None = None,
    time_to_us: int | None = None,
) -> Iterator[Row]:
    """The rows of one slice, in offset order; FormatError on damage.

    A slice whose head retention dropped after the cut (format 4) yields the
    rows still held, from the new retained start on: not damage.
    """
    stop_at = min(sl.last, sl.hi)
    if sl.first >= stop_at:
        return
    clip = _Clip(sl, time_from_us, time_to_us)
    fd = _open_segment(Path(data_dir) / sl.segment, sl) if sl.inline is None else _inline(sl)
    try:
        pos = sl.pos
        # Reads cost what they return: a small slice of a long file (a fork's
        # inherited piece, a short offset range) reads about its own size.
        chunk = min(READ_CHUNK, sl.size + 64 * 1024)
        while pos < sl.end_pos:
            buf = _read_exactly(fd, min(chunk, sl.end_pos - pos), pos, sl)
            consumed = pos
            try:
                for rec in iter_records(buf, pos, verify=verify):
                    consumed = rec.end
                    if rec.start >= stop_at:
                        return
                    row = clip.row(rec)
                    if row is not None:
                        yield row
            except (CorruptRecord, FormatError) as exc:
                pos = _past_dropped_head(data_dir, sl, consumed, exc)
                continue
            if consumed == pos:  # one record larger than the buffer, or a torn one
                chunk = max(chunk, _whole_record_size(buf, pos, sl))
                continue
            pos = consumed
            if chunk < READ_CHUNK:  # the estimate was short: grow back to full-size reads
                chunk = min(chunk * 2, READ_CHUNK)
    finally:
        if fd >= 0:
            os.close(fd)


class _Clip:
    """A record of the slice as the row it yields: cut to the slice's units and its
    time range (None when nothing of it is in them)."""

    def __init__(self, sl: Slice, time_from_us: int | None, time_to_us: int | None) -> None:
        self.sl = sl
        self.json = sl.kind == KIND_JSON
        self.time_from_us = time_from_us
        self.time_to_us = time_to_us

    def row(self, rec: Record) -> Row | None:
        sl = self.sl
        if rec.kind != sl.kind:
            raise FormatError(
                f"stream {sl.origin!r}: record of kind {rec.kind} at file "
                f"position {rec.pos} in a stream of kind {sl.kind}"
            )
        start = rec.start
        stop = start + (1 if self.json else len(rec.payload))
        a = start if start > sl.lo else sl.lo
        b = stop if stop < sl.hi else sl.hi
        if a >= b or a < sl.first:
            return None
        ts = rec.timestamp_us
        if (self.time_from_us is not None and ts < self.time_from_us) or (
            self.time_to_us is not None and ts >= self.time_to_us
        ):
            return None
        payload = rec.payload
        if a != start or b != stop:
            payload = payload[a - start : b - start]
        return Row(a, b, ts, rec.producer, payload)


def _open_segment(path: Path, sl: Slice) -> int:
    """The slice's segment file, open, its header checked."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FormatError(
            f"stream {sl.stream!r}: segment file {sl.segment} is gone "
            f"(stream {sl.origin!r} deleted after the cut)"
        ) from None
    try:
        check_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), int(Path(sl.segment).stem, 16))
    except CorruptRecord as exc:
        os.close(fd)
        raise FormatError(f"stream {sl.origin!r}: {exc}") from None
    return fd


def _inline(sl: Slice) -> int:
    """-1 (no descriptor) once the header of the slice's inline log is checked, as
    ``_open_segment`` checks a file's."""
    assert sl.inline is not None
    try:
        check_file_header(sl.inline[:FILE_HEADER_SIZE], int(Path(sl.segment).stem, 16))
    except CorruptRecord as exc:
        raise FormatError(f"stream {sl.origin!r}: {exc}") from None
    return -1


def _read_exactly(fd: int, want: int, pos: int, sl: Slice) -> bytes:
    """``want`` bytes of the slice's log from ``pos``: its file (``fd``) or its inline
    value."""
    buf = os.pread(fd, want, pos) if sl.inline is None else sl.inline[pos : pos + want]
    if len(buf) < want:
        raise FormatError(
            f"stream {sl.origin!r}: segment file ends at {pos + len(buf)}, "
            f"before its committed length {sl.end_pos}"
        )
    return buf


def _past_dropped_head(
    data_dir: str | Path, sl: Slice, consumed: int, exc: CorruptRecord | FormatError
) -> int:
    """Where to read on after damage at ``consumed``: retention may have dropped
    (punched) the head of the file since the cut, and then those rows are gone and the
    rest of the slice is still there; else the damage is real (FormatError)."""
    now = _retained_start_pos(data_dir, sl)
    if now is None or now <= consumed:
        if isinstance(exc, FormatError):
            raise exc
        raise FormatError(f"stream {sl.origin!r}: {exc}") from None
    return now


def _whole_record_size(buf: bytes, pos: int, sl: Slice) -> int:
    """The size of the record at ``pos`` that ``buf`` holds only the start of."""
    size = record_size(buf)
    if size is None or pos + size > sl.end_pos:
        raise FormatError(
            f"stream {sl.origin!r}: incomplete record at file position {pos}, "
            f"below the committed length {sl.end_pos}"
        )
    return size
