"""Reading a data directory from outside the server: a consistent cut, then records.

Pure format code over docs/storage-format.md (format version 1), no Spark:
the planner and the record reader are used by the data source on the driver
and on the workers, and are tested without a JVM.

The rules that make an outside read safe while a server keeps writing:

- the stream list and every committed tail come from one LMDB read
  transaction (a *cut*); LMDB is opened ``readonly=True, lock=False`` so a
  read-only mount works, and transactions stay short because an unlocked
  reader does not stop the writer from reusing pages;
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

from stream_server.engine.layout import VERSION_FILE, VERSION_LINE, Layout
from stream_server.engine.metadata import (
    DB_INDEX,
    DB_NAMES,
    DB_STREAMS,
    DB_TAILS,
    INDEX_KEY,
    TAIL,
    U64,
    U64_BE,
    StreamMeta,
    id_key,
    index_key,
)
from stream_server.engine.records import (
    FILE_HEADER_SIZE,
    KIND_BYTES,
    KIND_JSON,
    CorruptRecord,
    Producer,
    iter_records,
    record_size,
)

JSON_TYPE = "application/json"
READ_CHUNK = 8 * 1024 * 1024
INDEX_BATCH = 4096  # index entries per read transaction (about 64 MiB of segment file)


class FormatError(Exception):
    """The data directory is not one this reader understands, or is damaged."""


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


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

    @property
    def kind(self) -> int:
        return KIND_JSON if media_type(self.content_type) == JSON_TYPE else KIND_BYTES

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

    def chain(self, path: str, lo: int, hi: int) -> list[Piece]:
        """The pieces that make up ``path`` in ``[lo, hi)``, oldest first.

        The same stitching as the server's read: a fork holds its own units from
        its fork offset on and reads lower units through its source, which may
        itself be a fork. Pieces are cut at fork offsets exactly, so a sub-offset
        fork returns the inherited part of a source record only.
        """
        pieces: list[Piece] = []
        cur: StreamInfo | None = self.streams[path]
        top = hi
        while cur is not None and top > lo:
            own_lo = cur.fork_offset
            a, b = max(own_lo, lo), top
            if a < b:
                pieces.append(Piece(cur, a, b))
            top = min(top, own_lo)
            parent = cur.fork_from
            cur = None
            if parent is not None and top > lo:
                cur = self.streams.get(parent)
                if cur is None:
                    raise FormatError(f"stream {path!r}: fork source {parent!r} is missing")
        pieces.reverse()
        return pieces


def check_layout(data_dir: str | Path) -> Layout:
    """The directory's layout, or FormatError if it is not format version 1."""
    layout = Layout(Path(data_dir))
    version = layout.root / VERSION_FILE
    try:
        text = version.read_text(errors="replace")
    except FileNotFoundError:
        raise FormatError(
            f"{layout.root}: no {VERSION_FILE} file: not a durable-streams data directory"
        ) from None
    if text != VERSION_LINE:
        raise FormatError(
            f"{layout.root}: data format {text.strip()!r} is not supported by this reader "
            f"(it reads {VERSION_LINE.strip()!r})"
        )
    if not (layout.meta / "data.mdb").exists():
        raise FormatError(f"{layout.meta}: no LMDB environment")
    return layout


class MetaReader:
    """The LMDB environment of a data directory, opened read-only without locks.

    Used as a context manager: open, a few short read transactions, close.
    Never kept on an object that Spark pickles.
    """

    def __init__(self, data_dir: str | Path) -> None:
        self.layout = check_layout(data_dir)
        self.env = lmdb.open(
            str(self.layout.meta),
            readonly=True,
            lock=False,
            max_dbs=len(DB_NAMES) + 2,
            readahead=False,
            subdir=True,
        )
        try:
            self.dbs = {num: self.env.open_db(name, create=False) for num, name in DB_NAMES.items()}
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
        tails = {U64_BE.unpack(key)[0]: TAIL.unpack(value) for key, value in raw_tails}
        streams: dict[str, StreamInfo] = {}
        for key, value in raw_streams:
            path = key.decode("utf-8", "surrogatepass")
            m = StreamMeta.decode(value)
            tail = tails.get(m.id)
            if tail is None:  # no log (cannot happen in a committed cut): nothing to read
                continue
            file_len, unit, base = tail
            streams[path] = StreamInfo(
                path=path,
                id=m.id,
                content_type=m.content_type,
                tail=unit,
                file_len=file_len,
                base=base,
                closed=m.closed,
                soft_deleted=m.soft_deleted,
                expired=_expired(m, now),
                fork_from=m.fork_from,
                fork_offset=m.fork_offset,
                created_at=m.created_at,
            )
        return Cut(str(self.layout.root), now, streams)

    def index_floor(self, owner: StreamInfo, unit: int) -> tuple[int, int]:
        """(file position, unit) of the last indexed record start at or before ``unit``."""
        prefix = id_key(owner.id)
        with self._begin() as txn:
            cur = txn.cursor(db=self.dbs[DB_INDEX])
            found = cur.prev() if cur.set_range(index_key(owner.id, unit + 1)) else cur.last()
            if found and cur.key()[:8] == prefix:
                _, idx_unit = INDEX_KEY.unpack(cur.key())
                return U64.unpack(cur.value())[0], idx_unit
        return FILE_HEADER_SIZE, owner.base

    def boundaries(self, owner: StreamInfo, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """Indexed record starts (unit, file position) with ``lo < unit < hi``, in order.

        About one per 16 KiB of segment file: the places where a long piece can
        be split into partitions (or a trigger can stop) without cutting a record.
        Read in batches, one short transaction each: entries below a committed
        tail never change, so the batches join up exactly.
        """
        prefix = id_key(owner.id)
        start = index_key(owner.id, lo + 1)
        while True:
            batch: list[tuple[bytes, bytes]] = []
            with self._begin() as txn:
                cur = txn.cursor(db=self.dbs[DB_INDEX])
                if cur.set_range(start):
                    for key, value in cur:
                        batch.append((key, value))
                        if len(batch) >= INDEX_BATCH:
                            break
            for key, value in batch:
                if key[:8] != prefix:
                    return
                _, unit = INDEX_KEY.unpack(key)
                if unit >= hi:
                    return
                pos = U64.unpack(value)[0]
                if pos < owner.file_len:
                    yield unit, pos
            if len(batch) < INDEX_BATCH:
                return
            start = batch[-1][0] + b"\x00"


def _expired(m: StreamMeta, now: float) -> bool:
    """The server's rule (streams.model.Stream.expired) on the persisted fields."""
    if m.expires_at_ts is not None and now >= m.expires_at_ts:
        return True
    return m.ttl is not None and now >= m.touched_at + m.ttl


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
    payload: memoryview


def read_slice(
    data_dir: str | Path,
    sl: Slice,
    *,
    verify: bool = True,
    time_from_us: int | None = None,
    time_to_us: int | None = None,
) -> Iterator[Row]:
    """The rows of one slice, in offset order; FormatError on damage."""
    path = Path(data_dir) / sl.segment
    stop_at = min(sl.last, sl.hi)
    if sl.first >= stop_at:
        return
    json = sl.kind == KIND_JSON
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FormatError(
            f"stream {sl.stream!r}: segment file {sl.segment} is gone "
            f"(stream {sl.origin!r} deleted after the cut)"
        ) from None
    try:
        pos = sl.pos
        # Reads cost what they return: a small slice of a long file (a fork's
        # inherited piece, a short offset range) reads about its own size.
        chunk = min(READ_CHUNK, sl.size + 64 * 1024)
        while pos < sl.end_pos:
            want = min(chunk, sl.end_pos - pos)
            buf = os.pread(fd, want, pos)
            if len(buf) < want:
                raise FormatError(
                    f"stream {sl.origin!r}: segment file ends at {pos + len(buf)}, "
                    f"before its committed length {sl.end_pos}"
                )
            consumed = pos
            try:
                for rec in iter_records(buf, pos, verify=verify):
                    consumed = rec.end
                    start = rec.start
                    if start >= stop_at:
                        return
                    if rec.kind != sl.kind:
                        raise FormatError(
                            f"stream {sl.origin!r}: record of kind {rec.kind} at file "
                            f"position {rec.pos} in a stream of kind {sl.kind}"
                        )
                    plen = len(rec.payload)
                    stop = start + (1 if json else plen)
                    a = start if start > sl.lo else sl.lo
                    b = stop if stop < sl.hi else sl.hi
                    if a >= b or a < sl.first:
                        continue
                    ts = rec.timestamp_us
                    if (time_from_us is not None and ts < time_from_us) or (
                        time_to_us is not None and ts >= time_to_us
                    ):
                        continue
                    payload = rec.payload
                    if a != start or b != stop:
                        payload = payload[a - start : b - start]
                    yield Row(a, b, ts, rec.producer, payload)
            except CorruptRecord as exc:
                raise FormatError(f"stream {sl.origin!r}: {exc}") from None
            if consumed == pos:  # one record larger than the buffer, or a torn one
                size = record_size(buf)
                if size is None or pos + size > sl.end_pos:
                    raise FormatError(
                        f"stream {sl.origin!r}: incomplete record at file position {pos}, "
                        f"below the committed length {sl.end_pos}"
                    )
                chunk = max(chunk, size)
                continue
            pos = consumed
            if chunk < READ_CHUNK:  # the estimate was short: grow back to full-size reads
                chunk = min(chunk * 2, READ_CHUNK)
    finally:
        os.close(fd)


def segment_relpath(layout: Layout, stream_id: int) -> str:
    return str(layout.segment_path(stream_id).relative_to(layout.root))
