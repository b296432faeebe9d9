"""Reads of the committed log: payloads by unit range, record ends, keyed records.

A catch-up read costs what it returns: it starts from the caller's hint or the
index entry at or below its first unit (about one per 16 KiB of segment file)
and reads forward with positional reads, checking each record's checksum, and
never past the committed tail. Reads run on any thread, beside the writer:
what they look at (the committed part of each file, LMDB in a read
transaction) only grows. A record that fails its checksum marks its stream
damaged (``DamagedStream``); one below a retained start that a drop moved
meanwhile is not damage (``HeadDropped``).

``LogReads`` is an object of its own so that the two processes that read a data
directory read it by the same code: the engine, over the tails it publishes, and a
worker (``workers/local_reads.py``), over the tails the writer told it and LMDB
opened for reading only.
"""

from __future__ import annotations

from collections.abc import Iterator

from stream_format import index
from stream_format.meta import (
    DB_INDEX,
    DB_PRODUCERS,
    DB_RECORDS,
    DB_STREAMS,
    DB_TAILS,
    PRODUCER,
    StreamMeta,
    decode_tail,
    id_key,
    key_in_space,
    key_producer,
    space_prefix,
    stream_key,
    stream_path,
)
from stream_format.records import (
    FLAG_PRODUCER,
    KIND_JSON,
    PRODUCER_TAIL,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    CorruptRecord,
    crc32,
    iter_records,
    record_size,
)
from stream_server.engine.batch import Tail
from stream_server.engine.metadata import Metadata
from stream_server.engine.segments import Segments
from stream_server.engine.storage_errors import DamagedStream, HeadDropped

HINT_REACH = 4096  # units a read hint may be behind the start and still be used


class LogReads:
    """Reads of the logs in ``segments`` (and of LMDB, once ``segments.meta`` is open)
    up to ``tails``, which the owner keeps current: the engine publishes into the same
    dict, a worker puts in what the writer told it.

    ``starts_in_lmdb``: a read that finds no record where one should be also checks
    the stream's retained start in LMDB as it is now, for a reader whose ``tails``
    may be older than a drop (a worker's): a drop that overtook the read is then
    ``HeadDropped``, not damage."""

    def __init__(
        self,
        segments: Segments,
        tails: dict[int, Tail] | None = None,
        *,
        starts_in_lmdb: bool = False,
    ) -> None:
        self.segments = segments
        self.tails: dict[int, Tail] = {} if tails is None else tails
        self.damaged: dict[int, str] = {}  # stream id -> why its log cannot be read
        self.starts_in_lmdb = starts_in_lmdb

    @property
    def meta(self) -> Metadata:
        """LMDB, as the segments read it (inline logs): one environment for both."""
        meta = self.segments.meta
        assert meta is not None, "LMDB is not open yet"
        return meta

    def forget_damage(self) -> None:
        """Forget every stream found damaged, and every file header checked: a reader
        whose view may be older than a drop (a worker's) must not remember damage that
        was a drop overtaking it; the next read checks again."""
        self.damaged.clear()
        self.segments.checked.clear()

    def keyed_values(self, space: str) -> dict[str, bytes]:
        """Every committed keyed value of ``space`` (``ops.PutKeyedValue``), by key, from one
        LMDB read transaction. Runs on any thread."""
        prefix = space_prefix(space)
        out: dict[str, bytes] = {}
        with self.meta.env.begin() as txn:
            cur = txn.cursor(db=self.meta.dbs[DB_RECORDS])
            if cur.set_range(prefix):
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    out[key_in_space(key, prefix)] = bytes(value)
        return out

    def stored_stream(self, path: str) -> tuple[StreamMeta, dict[str, tuple[int, int]]] | None:
        """The committed configuration of the stream at ``path`` and its producers'
        (epoch, seq) by id, from one LMDB read transaction; None when there is none.
        The stream layer loads a stream this way the first time it is asked for."""
        dbs = self.meta.dbs
        with self.meta.env.begin() as txn:
            raw = txn.get(stream_key(path), db=dbs[DB_STREAMS])
            if raw is None:
                return None
            meta = StreamMeta.from_json(raw)
            producers: dict[str, tuple[int, int]] = {}
            prefix = id_key(meta.id)
            cur = txn.cursor(db=dbs[DB_PRODUCERS])
            if cur.set_range(prefix):
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    producers[key_producer(key)[1]] = PRODUCER.unpack(value)
        return meta, producers

    def stored_paths(self, prefix: str = "", batch: int = 4096) -> Iterator[str]:
        """The paths of every committed stream under ``prefix``, in order, read in short
        transactions of ``batch`` keys (a path deleted meanwhile may still be named)."""
        db = self.meta.dbs[DB_STREAMS]
        lo = stream_key(prefix)
        after: bytes | None = None  # the last key of the previous transaction
        while True:
            keys: list[bytes] = []
            with self.meta.env.begin() as txn:
                cur = txn.cursor(db=db)
                if cur.set_range(after or lo):
                    for key in cur.iternext(values=False):
                        if key == after:
                            continue
                        if not key.startswith(lo):
                            break
                        keys.append(bytes(key))
                        if len(keys) >= batch:
                            break
            yield from (stream_path(k) for k in keys)
            if len(keys) < batch:
                return
            after = keys[-1]

    def stored_stream_count(self) -> int:
        """How many streams LMDB holds (soft-deleted ones included): one page read; 0
        before the engine is open (probes and metrics ask while recovery runs)."""
        meta = self.segments.meta
        if meta is None:
            return 0
        with meta.env.begin() as txn:
            return int(txn.stat(meta.dbs[DB_STREAMS])["entries"])

    def index_floor(
        self, sid: int, unit: int | None, *, max_pos: int | None = None
    ) -> tuple[int, int]:
        """The last indexed (file position, unit) at or before ``unit`` (or ``max_pos``)."""
        tail = self.tails.get(sid)
        with self.meta.env.begin() as txn:
            return index.floor(
                txn,
                self.meta.dbs[DB_INDEX],
                sid,
                unit,
                tail.base if tail else 0,
                max_pos=max_pos,
                first=(tail.start_pos, tail.start) if tail else None,
            )

    def _below_start(self, sid: int, pos: int) -> None:
        """HeadDropped if ``pos`` is below the retained start (in ``tails``, and with
        ``starts_in_lmdb`` in LMDB as it is now): a drop overtook this read (it found
        the bytes as they were punched), which is not damage."""
        tail = self.tails.get(sid)
        if tail is not None and pos < tail.start_pos:
            raise HeadDropped(tail.start)
        if self.starts_in_lmdb:
            with self.meta.env.begin() as txn:
                raw = txn.get(id_key(sid), db=self.meta.dbs[DB_TAILS])
            if raw is not None and pos < (now := decode_tail(raw)).start_pos:
                raise HeadDropped(now.start)

    def record_end(self, sid: int, unit: int) -> int:
        """The unit just past the record that covers ``unit``."""
        pos, _ = self.index_floor(sid, unit)
        log = self.segments.open_log(sid)
        try:
            chunk = 1 << 20
            while True:
                buf = log.pread(chunk, pos)
                if not buf:
                    return unit
                last = pos
                for rec in iter_records(buf, pos):
                    last = rec.end
                    if rec.start <= unit < rec.stop:
                        return rec.stop
                if last == pos:  # a record larger than the buffer
                    chunk = (record_size(buf) or 0) + 64
                pos = last
        finally:
            log.close()

    def _check_readable(self, sid: int) -> None:
        """DamagedStream for a stream found damaged, or whose file header (checked on
        its first read) is not its own."""
        if sid in self.damaged:
            raise DamagedStream(self.damaged[sid])
        if sid not in self.segments.checked:
            try:
                self.segments.check_header(sid)
            except CorruptRecord as exc:
                self.damaged[sid] = str(exc)
                raise DamagedStream(str(exc)) from None

    def _read_position(self, sid: int, start: int, hint: tuple[int, int] | None) -> int:
        """Where a read of ``start`` begins scanning: the caller's hint when it is at or
        past the retained start and close enough, else the index entry at or below."""
        t = self.tails.get(sid)
        if (
            hint is not None
            and hint[1] >= (t.start_pos if t is not None else 0)
            and 0 <= start - hint[0] <= HINT_REACH
        ):
            return hint[1]  # continuing where the last read stopped: no index lookup
        return self.index_floor(sid, start)[0]

    def read(  # noqa: C901 - the read path: an inline loop per record, no object per record
        self,
        sid: int,
        kind: int,
        start: int,
        stop: int,
        max_bytes: int,
        hint: tuple[int, int] | None = None,
    ) -> tuple[list[memoryview], int, tuple[int, int]]:
        """Payloads covering units [start, stop), at most ``max_bytes`` (one JSON message at least).

        Returns the payloads, the unit just after them, and a (unit, file position)
        hint the caller may pass back to continue without an index lookup.
        Runs on any thread; reads only what it returns plus at most one index
        granule.
        """
        self._check_readable(sid)
        if start >= stop:
            return [], start, hint or (start, -1)
        pos = self._read_position(sid, start, hint)
        out: list[memoryview] = []  # slices of the read buffers: joined once by the caller
        total = 0
        cur = start
        chunk = max(256 * 1024, min(max_bytes + 64 * 1024, 8 * 1024 * 1024))
        unpack = RECORD_HEADER.unpack_from
        json = kind == KIND_JSON
        log = self.segments.open_log(sid)
        try:
            while cur < stop and total < max_bytes:
                buf = log.pread(chunk, pos)
                if not buf:
                    self._below_start(sid, pos)
                    raise DamagedStream(f"stream id {sid}: log ends before unit {stop}")
                mv = memoryview(buf)
                n = len(mv)
                off = 0
                # The hot loop of every catch-up read: no per-record objects.
                while off + RECORD_HEADER_SIZE <= n:
                    crc, plen, rkind, flags, pidlen, rstart, _ = unpack(mv, off)
                    end = off + RECORD_HEADER_SIZE + plen
                    if flags & FLAG_PRODUCER:
                        end += PRODUCER_TAIL.size + pidlen
                    if end > n:
                        break
                    if crc32(mv[off + 4 : end]) != crc or rkind != kind:
                        self._below_start(sid, pos + off)
                        msg = f"stream id {sid}: bad record at file position {pos + off}"
                        self.damaged[sid] = msg
                        raise DamagedStream(msg)
                    rstop = rstart + (1 if json else plen)
                    if rstop <= cur:
                        off = end
                        continue
                    if json:
                        if out and total + plen > max_bytes:
                            return out, cur, (cur, pos + off)
                        out.append(mv[end - plen : end])
                        total += plen
                        cur = rstop
                    else:
                        skip = cur - rstart
                        take = min(plen - skip, stop - cur, max_bytes - total)
                        first = end - plen + skip
                        out.append(mv[first : first + take])
                        total += take
                        cur += take
                        if cur < rstop:  # stopped inside this record
                            return out, cur, (rstart, pos + off)
                    off = end
                    if cur >= stop or total >= max_bytes:
                        return out, cur, (cur, pos + off)
                if off == 0:  # one record larger than the buffer
                    chunk = max(chunk, (record_size(buf) or 0) + 64)
                pos += off
        finally:
            log.close()
        return out, cur, (cur, pos)
