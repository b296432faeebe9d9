"""The storage engine: durable batches, positional reads, checkpoints and recovery.

Path of one batch (called from the single writer thread):

1. encode records and write them to the segment files (page cache only);
2. write one WAL frame holding the records and every metadata change, and
   fdatasync it: from here the batch survives a crash;
3. commit the metadata to LMDB (tails, index, producers, stream config);
4. publish the new tails to readers; the caller then acknowledges.

A failure in 1-3 that leaves the disk consistent (disk full) undoes the batch
and raises StorageError; a failed flush fails the engine closed.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from stream_format import index
from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_format.meta import (
    DB_INDEX,
    DB_INFO,
    DB_PRODUCERS,
    DB_STREAMS,
    DB_TAILS,
    KEY_NEXT_STREAM_ID,
    PRODUCER,
    TAIL,
    U64,
    U64_BE,
    StreamMeta,
    id_key,
    index_key,
    producer_key,
    stream_key,
    stream_path,
)
from stream_format.records import (
    FILE_HEADER_SIZE,
    FLAG_PRODUCER,
    KIND_JSON,
    PRODUCER_TAIL,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    CorruptRecord,
    check_file_header,
    crc32,
    encode_file_header,
    encode_record,
    iter_records,
    record_size,
    record_units,
)
from stream_server.engine import fsio
from stream_server.engine.errors import DamagedStream, StorageError, StorageFailed
from stream_server.engine.layout import prepare
from stream_server.engine.metadata import Metadata, delete_prefix
from stream_server.engine.ops import (
    Append,
    CreateLog,
    DeleteProducer,
    DeleteStream,
    DropLog,
    Op,
    PutProducer,
    PutStream,
)
from stream_server.engine.wal import WalWriter

log = logging.getLogger("stream_server.engine")

INDEX_GRANULARITY = 16 * 1024  # at most this many bytes scanned to find a unit
CHECKPOINT_BYTES = 64 * 1024 * 1024  # WAL size that triggers a checkpoint
WRITER_FDS = 256
HINT_REACH = 4096  # units a read hint may be behind the start and still be used


@dataclass(slots=True)
class Tail:
    file_len: int
    unit: int
    base: int  # first unit of the stream's own log (its fork offset, or 0)


@dataclass(slots=True)
class LoadedState:
    streams: dict[str, StreamMeta]
    tails: dict[int, Tail]
    producers: dict[int, dict[str, tuple[int, int]]]
    next_stream_id: int


@dataclass(slots=True)
class RecoveryReport:
    seconds: float = 0.0
    streams: int = 0
    wal_frames_replayed: int = 0
    truncated_streams: int = 0
    truncated_bytes: int = 0
    damaged: dict[int, str] = field(default_factory=dict)
    orphan_files_removed: int = 0


@dataclass(slots=True)
class BatchStats:
    """Where one batch's time went, for metrics and slow-append logs."""

    appends: int = 0
    bytes: int = 0
    write_seconds: float = 0.0
    fsync_seconds: float = 0.0
    commit_seconds: float = 0.0


class Engine:
    def __init__(
        self,
        data_dir: Path,
        *,
        map_size: int = 1 << 33,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        fault_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.layout = Layout(Path(data_dir))
        self.map_size = map_size
        self.checkpoint_bytes = checkpoint_bytes
        self.meta: Metadata | None = None
        self.wal: WalWriter | None = None
        self.tails: dict[int, Tail] = {}
        self.damaged: dict[int, str] = {}
        self._headers_checked: set[int] = set()  # segment files whose magic and id were seen
        self.failed: str | None = None
        self.lsn = 0
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._dirty: set[int] = set()
        self._checkpoint_thread: threading.Thread | None = None
        self._checkpoint_lock = threading.Lock()
        # Fault hook: called with a stage name ("segments", "fsync", "wal", "commit")
        # so fault tests can stop the process between the steps of a batch, or
        # make the flush fail (see stream_server.faults).
        self.fault_hook = fault_hook

    # ------------------------------------------------------------------ start

    def open(self) -> tuple[LoadedState, RecoveryReport]:
        started = time.monotonic()
        prepare(self.layout)
        self.meta = Metadata(self.layout.meta, self.map_size)
        report = RecoveryReport()
        touched = self._replay_wal(report)
        state = self._load()
        self.tails = state.tails
        self._check_tails(state, touched, report)
        self._remove_orphans(report)
        self.meta.sync()
        number = max((int(p.stem) for p in walmod.wal_files(self.layout.wal)), default=0) + 1
        for path in walmod.wal_files(self.layout.wal):
            fsio.unlink(path)
        self.wal = WalWriter(self.layout.wal, number)
        report.streams = len(state.streams)
        report.damaged = dict(self.damaged)
        report.seconds = time.monotonic() - started
        return state, report

    def _replay_wal(self, report: RecoveryReport) -> set[int]:
        """Redo every frame since the last checkpoint; idempotent by construction."""
        files = walmod.wal_files(self.layout.wal)
        touched: set[int] = set()
        for i, path in enumerate(files):
            for frame in walmod.read_frames(path, last_file=i == len(files) - 1):
                meta_entries = []
                for entry in frame.entries:
                    if entry[0] == walmod.WRITE:
                        _, sid, pos, data = entry
                        fsio.pwrite(self._writer_fd(sid), data, pos)
                        touched.add(sid)
                    else:
                        meta_entries.append(entry)
                self._lmdb_write(meta_entries)
                self.lsn = max(self.lsn, frame.lsn)
                report.wal_frames_replayed += 1
        # The WAL is deleted once recovery ends: what it redid must be durable first,
        # the files' directory entries included (replay may have created them).
        for sid in touched:
            fsio.fdatasync(self._writer_fd(sid))
        for sub in {self.layout.segment_path(sid).parent for sid in touched}:
            fsio.fsync_dir(sub)
        return touched

    def _load(self) -> LoadedState:
        assert self.meta is not None
        streams: dict[str, StreamMeta] = {}
        tails: dict[int, Tail] = {}
        producers: dict[int, dict[str, tuple[int, int]]] = {}
        next_id = 1
        with self.meta.env.begin() as txn:
            raw = txn.get(KEY_NEXT_STREAM_ID, db=self.meta.dbs[DB_INFO])
            if raw:
                next_id = U64.unpack(raw)[0]
            for key, value in txn.cursor(db=self.meta.dbs[DB_STREAMS]):
                streams[stream_path(key)] = StreamMeta.from_json(value)
            for key, value in txn.cursor(db=self.meta.dbs[DB_TAILS]):
                file_len, unit, base = TAIL.unpack(value)
                tails[U64_BE.unpack(key)[0]] = Tail(file_len, unit, base)
            for key, value in txn.cursor(db=self.meta.dbs[DB_PRODUCERS]):
                sid = U64_BE.unpack_from(key)[0]
                pid = bytes(key[8:]).decode("utf-8", "surrogatepass")
                producers.setdefault(sid, {})[pid] = PRODUCER.unpack(value)
        return LoadedState(streams, tails, producers, next_id)

    def _check_tails(self, state: LoadedState, touched: set[int], report: RecoveryReport) -> None:
        """Make each segment file end exactly at its committed tail.

        Bytes past the tail were never acknowledged (a batch that died before its
        commit) and are cut off. A file shorter than its tail lost acknowledged
        bytes to something outside our control (a damaged disk, a hand edit): the
        stream is recovered to its last whole record and the loss is reported.
        """
        for sid, tail in list(state.tails.items()):
            path = self.layout.segment_path(sid)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                self.damaged[sid] = f"segment file {path} is missing"
                continue
            if size > tail.file_len:
                fsio.truncate(path, tail.file_len)
                report.truncated_streams += 1
                report.truncated_bytes += size - tail.file_len
                touched.add(sid)
            elif size < tail.file_len:
                self._recover_short_file(sid, size, tail, report)
                continue
            if sid in touched:
                try:
                    self._verify_tail_records(sid, tail)
                except CorruptRecord as exc:
                    self.damaged[sid] = str(exc)

    def _recover_short_file(self, sid: int, size: int, tail: Tail, report: RecoveryReport) -> None:
        assert self.meta is not None
        path = self.layout.segment_path(sid)
        start_pos, start_unit = self._index_floor(sid, None, max_pos=size)
        good_pos, good_unit = start_pos, start_unit
        data = _read_range(path, start_pos, size - start_pos)
        try:
            for rec in iter_records(data, start_pos):
                good_pos, good_unit = rec.end, rec.stop
        except CorruptRecord:
            pass
        fsio.truncate(path, good_pos)
        log.error(
            "stream id %d: segment file is %d bytes short of its committed tail; "
            "recovered to the last whole record (unit %d, %d units lost)",
            sid,
            tail.file_len - size,
            good_unit,
            tail.unit - good_unit,
        )
        new_tail = Tail(good_pos, good_unit, tail.base)
        self.tails[sid] = new_tail
        with self.meta.write() as txn:
            txn.put(
                id_key(sid),
                TAIL.pack(new_tail.file_len, new_tail.unit, new_tail.base),
                db=self.meta.dbs[DB_TAILS],
            )
            # Index entries past the recovered tail point at bytes that are gone.
            delete_prefix(
                txn, self.meta.dbs[DB_INDEX], id_key(sid), start=index_key(sid, good_unit + 1)
            )
        report.truncated_streams += 1
        report.truncated_bytes += tail.file_len - good_pos

    def _verify_tail_records(self, sid: int, tail: Tail) -> None:
        self._check_header(sid)
        pos, _ = self._index_floor(sid, None, max_pos=tail.file_len)
        data = _read_range(self.layout.segment_path(sid), pos, tail.file_len - pos)
        end = pos
        for rec in iter_records(data, pos):
            end = rec.end
        if end != tail.file_len:
            raise CorruptRecord(f"stream id {sid}: records end at {end}, tail is {tail.file_len}")

    def _check_header(self, sid: int) -> None:
        """CorruptRecord unless the segment file starts with the magic and its stream id."""
        check_file_header(_read_range(self.layout.segment_path(sid), 0, FILE_HEADER_SIZE), sid)
        self._headers_checked.add(sid)

    def _remove_orphans(self, report: RecoveryReport) -> None:
        """Delete segment files of streams whose deletion committed before a crash."""
        for sub in self.layout.segments.iterdir():
            if not sub.is_dir():
                continue
            for path in sub.iterdir():
                try:
                    sid = int(path.stem, 16)
                except ValueError:
                    continue
                if sid not in self.tails:
                    self._close_fd(sid)
                    fsio.unlink(path)
                    report.orphan_files_removed += 1

    # ------------------------------------------------------------------ write

    def commit(self, ops: list[Op]) -> BatchStats:
        """Make a batch durable. Runs on the writer thread only."""
        if self.failed:
            raise StorageFailed(f"storage failed closed: {self.failed}")
        assert self.meta is not None and self.wal is not None
        stats = BatchStats()
        t0 = time.perf_counter()
        fb = walmod.FrameBuilder()
        meta_entries: list[walmod.Entry] = []
        writes: dict[int, list[Any]] = {}  # sid -> [start position, [chunks]]
        local: dict[int, Tail] = {}
        dropped: list[int] = []
        now_us = time.time_ns() // 1000

        def put(db: int, key: bytes, value: bytes) -> None:
            fb.put(db, key, value)
            meta_entries.append((walmod.PUT, db, key, value))

        for op in ops:
            if isinstance(op, Append):
                tail = local.get(op.stream_id)
                if tail is None:
                    base = self.tails[op.stream_id]
                    tail = local[op.stream_id] = Tail(base.file_len, base.unit, base.base)
                w = writes.get(op.stream_id)
                if w is None:
                    w = writes[op.stream_id] = [tail.file_len, []]
                chunks = w[1]
                for payload in op.payloads:
                    rec = encode_record(op.kind, payload, tail.unit, now_us, op.producer)
                    start = tail.file_len
                    end = start + len(rec)
                    chunks.append(rec)
                    tail.file_len = end
                    tail.unit += record_units(op.kind, len(payload))
                    if start // INDEX_GRANULARITY != end // INDEX_GRANULARITY:
                        put(DB_INDEX, index_key(op.stream_id, tail.unit), U64.pack(end))
                    stats.appends += 1
                    stats.bytes += len(payload)
            elif isinstance(op, PutStream):
                put(DB_STREAMS, stream_key(op.path), op.meta.to_json())
            elif isinstance(op, PutProducer):
                put(
                    DB_PRODUCERS,
                    producer_key(op.stream_id, op.producer_id),
                    PRODUCER.pack(op.epoch, op.seq),
                )
            elif isinstance(op, DeleteProducer):
                key = producer_key(op.stream_id, op.producer_id)
                fb.delete(DB_PRODUCERS, key)
                meta_entries.append((walmod.DELETE, DB_PRODUCERS, key))
            elif isinstance(op, CreateLog):
                local[op.stream_id] = Tail(FILE_HEADER_SIZE, op.start_unit, op.start_unit)
                writes[op.stream_id] = [0, [encode_file_header(op.stream_id)]]
                put(DB_INFO, KEY_NEXT_STREAM_ID, U64.pack(op.stream_id + 1))
            elif isinstance(op, DeleteStream):
                key = stream_key(op.path)
                fb.delete(DB_STREAMS, key)
                meta_entries.append((walmod.DELETE, DB_STREAMS, key))
            elif isinstance(op, DropLog):
                sid = op.stream_id
                local.pop(sid, None)
                writes.pop(sid, None)
                dropped.append(sid)
                fb.delete(DB_TAILS, id_key(sid))
                meta_entries.append((walmod.DELETE, DB_TAILS, id_key(sid)))
                for db in (DB_PRODUCERS, DB_INDEX):
                    fb.delete_prefix(db, id_key(sid))
                    meta_entries.append((walmod.DELETE_PREFIX, db, id_key(sid)))
        for sid, tail in local.items():
            put(DB_TAILS, id_key(sid), TAIL.pack(tail.file_len, tail.unit, tail.base))

        # 1. segment files (page cache): undone by truncation if anything fails.
        undo: list[tuple[int, int]] = []
        try:
            for sid, (start, chunks) in writes.items():
                data = b"".join(chunks)
                fb.write(sid, start, data)
                fd = self._writer_fd(sid)
                undo.append((sid, start))
                fsio.pwrite(fd, data, start)
            self._hook("segments")
            t1 = time.perf_counter()
            stats.write_seconds = t1 - t0
            # 2. the WAL frame, flushed: the batch is now durable.
            self.lsn += 1
            frame = fb.frame(self.lsn)
            wal_size = self.wal.size
            try:
                self.wal.append(frame)
            except OSError:
                self._undo_wal(wal_size)
                raise
        except OSError as exc:
            self.lsn -= 1
            self._undo_segments(undo)
            raise StorageError(
                f"write failed: {exc.strerror or exc}", disk_full=exc.errno == errno.ENOSPC
            ) from exc
        try:
            self._hook("fsync")
            self.wal.sync()
        except OSError as exc:
            self._fail(f"WAL fdatasync failed: {exc}")
            raise StorageFailed(f"storage failed closed: {self.failed}") from exc
        t2 = time.perf_counter()
        stats.fsync_seconds = t2 - t1
        # 3. metadata.
        try:
            self._hook("wal")
            self._lmdb_write(meta_entries)
        except BaseException as exc:
            if not isinstance(exc, lmdb.Error):
                # Unknown state between a durable frame and its commit: stop writing.
                self._fail(f"batch failed after its WAL flush: {exc!r}")
                raise
            # The frame is durable but unacknowledged; take it back so that a
            # restart does not replay what we are about to report as failed.
            try:
                self._undo_wal(wal_size)
                self.wal.sync()
            except OSError as exc2:
                self._fail(f"metadata commit failed and the WAL could not be rolled back: {exc2}")
                raise StorageFailed(f"storage failed closed: {self.failed}") from exc
            self.lsn -= 1
            self._undo_segments(undo)
            disk_full = "MDB_MAP_FULL" in str(exc) or "No space" in str(exc)
            raise StorageError(f"metadata commit failed: {exc}", disk_full=disk_full) from exc
        self._hook("commit")
        stats.commit_seconds = time.perf_counter() - t2
        # 4. publish.
        self.tails.update(local)
        self._dirty.update(writes)
        for sid in dropped:
            self.tails.pop(sid, None)
            self._dirty.discard(sid)
            self._close_fd(sid)
            fsio.unlink(self.layout.segment_path(sid))
        if self.wal.size >= self.checkpoint_bytes:
            self.start_checkpoint()
        return stats

    def _lmdb_write(self, entries: list[walmod.Entry]) -> None:
        assert self.meta is not None
        if not entries:
            return
        while True:
            try:
                with self.meta.write() as txn:
                    self.meta.apply(txn, entries)
                return
            except lmdb.MapFullError:
                self.meta.grow()
                log.info("LMDB map grown to %d bytes", self.meta.env.info()["map_size"])

    def _undo_segments(self, undo: list[tuple[int, int]]) -> None:
        for sid, start in undo:
            try:
                fsio.ftruncate(self._writer_fd(sid), start)
            except OSError as exc:  # the bytes stay past the committed tail: harmless
                log.warning("could not trim stream id %d after a failed batch: %s", sid, exc)

    def _undo_wal(self, size: int) -> None:
        assert self.wal is not None
        self.wal.truncate_to(size)

    def _fail(self, reason: str) -> None:
        if not self.failed:
            self.failed = reason
            log.critical("storage failed closed, refusing all writes until restart: %s", reason)

    def _hook(self, stage: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(stage)

    def _writer_fd(self, sid: int) -> int:
        fd = self._fds.get(sid)
        if fd is not None:
            self._fds.move_to_end(sid)
            return fd
        path = self.layout.segment_path(sid)
        try:
            fd = fsio.open_write(path)
        except FileNotFoundError:
            fsio.mkdir(path.parent)
            fsio.fsync_dir(path.parent.parent)
            fd = fsio.open_write(path)
        self._fds[sid] = fd
        if len(self._fds) > WRITER_FDS:
            _, old = self._fds.popitem(last=False)
            fsio.close(old)
        return fd

    def _close_fd(self, sid: int) -> None:
        fd = self._fds.pop(sid, None)
        if fd is not None:
            fsio.close(fd)

    # ------------------------------------------------------------- checkpoint

    def start_checkpoint(self) -> None:
        """Rotate the WAL and flush, on another thread, what the old files cover."""
        if self._checkpoint_thread is not None and self._checkpoint_thread.is_alive():
            return
        assert self.wal is not None
        old_wal = self.wal
        self.wal = old_wal.rotate()
        dirty, self._dirty = self._dirty, set()
        self._checkpoint_thread = threading.Thread(
            target=self._checkpoint, args=(dirty, old_wal.number), name="checkpoint", daemon=True
        )
        self._checkpoint_thread.start()

    def _checkpoint(self, dirty: set[int], upto_number: int) -> None:
        with self._checkpoint_lock:
            try:
                for sid in dirty:
                    fsio.fdatasync_path(self.layout.segment_path(sid))  # gone: nothing to keep
                for sub in {self.layout.segment_path(s).parent for s in dirty}:
                    if sub.exists():
                        fsio.fsync_dir(sub)
                assert self.meta is not None
                self.meta.sync()
                for path in walmod.wal_files(self.layout.wal):
                    if int(path.stem) <= upto_number:
                        fsio.unlink(path)
                fsio.fsync_dir(self.layout.wal)
            except OSError as exc:
                self._fail(f"checkpoint flush failed: {exc}")

    def close(self) -> None:
        """Clean shutdown: a final checkpoint leaves an empty WAL for a fast start."""
        if self._checkpoint_thread is not None:
            self._checkpoint_thread.join()
        if self.wal is not None:
            if not self.failed:
                number = self.wal.number
                self.wal.close()
                dirty, self._dirty = self._dirty, set()
                self._checkpoint(dirty, number)
            else:
                self.wal.close()
            self.wal = None
        for fd in self._fds.values():
            fsio.close(fd)
        self._fds.clear()
        if self.meta is not None:
            self.meta.close()
            self.meta = None

    # ------------------------------------------------------------------- read

    def _index_floor(
        self, sid: int, unit: int | None, *, max_pos: int | None = None
    ) -> tuple[int, int]:
        """The last indexed (file position, unit) at or before ``unit`` (or ``max_pos``)."""
        assert self.meta is not None
        tail = self.tails.get(sid)
        with self.meta.env.begin() as txn:
            return index.floor(
                txn,
                self.meta.dbs[DB_INDEX],
                sid,
                unit,
                tail.base if tail else 0,
                max_pos=max_pos,
            )

    def record_end(self, sid: int, unit: int) -> int:
        """The unit just past the record that covers ``unit``."""
        pos, _ = self._index_floor(sid, unit)
        fd = fsio.open_read(self.layout.segment_path(sid))
        try:
            chunk = 1 << 20
            while True:
                buf = fsio.pread(fd, chunk, pos)
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
            fsio.close(fd)

    def read(
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
        if sid in self.damaged:
            raise DamagedStream(self.damaged[sid])
        if sid not in self._headers_checked:
            try:
                self._check_header(sid)
            except CorruptRecord as exc:
                self.damaged[sid] = str(exc)
                raise DamagedStream(str(exc)) from None
        if start >= stop:
            return [], start, hint or (start, -1)
        if hint is not None and hint[1] >= 0 and 0 <= start - hint[0] <= HINT_REACH:
            pos = hint[1]  # continuing where the last read stopped: no index lookup
        else:
            pos, _ = self._index_floor(sid, start)
        out: list[memoryview] = []  # slices of the read buffers: joined once by the caller
        total = 0
        cur = start
        chunk = max(256 * 1024, min(max_bytes + 64 * 1024, 8 * 1024 * 1024))
        unpack = RECORD_HEADER.unpack_from
        json = kind == KIND_JSON
        fd = fsio.open_read(self.layout.segment_path(sid))
        try:
            while cur < stop and total < max_bytes:
                buf = fsio.pread(fd, chunk, pos)
                if not buf:
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
            fsio.close(fd)
        return out, cur, (cur, pos)


def _read_range(path: Path, pos: int, size: int) -> bytes:
    fd = fsio.open_read(path)
    try:
        return fsio.pread(fd, size, pos)
    finally:
        fsio.close(fd)
