"""The storage engine: durable batches, positional reads, checkpoints and recovery.

Path of one batch (called from the single writer thread):

1. build it (``batch.build``): the records for each segment file and one list
   of metadata changes;
2. write the records to the segment files (page cache only);
3. write one WAL frame holding the records and the metadata changes, and
   fdatasync it: from here the batch survives a crash; in a replica set the
   frame is shipped to the standbys now, so their apply overlaps step 4;
4. commit the same metadata changes to LMDB (tails, index, producers, streams);
5. publish the new tails to readers; the caller then acknowledges.

A failure in 2-4 that leaves the disk consistent (disk full) undoes the batch
and raises StorageError; a failed flush fails the engine closed, and so does a
failed LMDB commit in a replica set (the frame was shipped: it cannot be taken
back). Recovery is ``recovery.Recovery``; the segment files' descriptors are
``segments.Segments``.

Frames another engine made (a primary's, on a standby) are applied by the
same steps: ``append_frames`` (segments, the WAL, the flush), then
``commit_frames`` (LMDB, then the publish step a batch of ours ends with), so
a standby's engine is in the state its primary's is after the same frames,
and there is one publish path. The pure parts of that are ``frames.py``.

Over 400 lines because the batch path, the frame path, reads, checkpoints and
the fail-closed state share the LMDB environment, the WAL and one lock;
recovery, segments, batch building and the frames' pure steps are already
modules of their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import lmdb

from stream_format import index
from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_format.meta import (
    DB_INDEX,
    DB_RECORDS,
    index_key,
    key_in_space,
    space_prefix,
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
from stream_server.engine import fsio
from stream_server.engine.batch import Batch, BatchStats, Tail, build
from stream_server.engine.data_dir import prepare, retire_wal, wal_headerless
from stream_server.engine.errors import (
    DamagedStream,
    HeadDropped,
    StorageFailed,
    from_lmdb_error,
    from_os_error,
)
from stream_server.engine.frames import (
    AppendedFrames,
    ReplicaRole,
    coalesced,
    split_frames,
    tail_effects,
)
from stream_server.engine.metadata import Metadata
from stream_server.engine.ops import DropHead, Op
from stream_server.engine.recovery import (
    LoadedState,
    Recovery,
    RecoveryProgress,
    RecoveryReport,
)
from stream_server.engine.segments import Segments
from stream_server.engine.wal_writer import WalWriter

__all__ = [
    "AppendedFrames",
    "BatchStats",
    "Engine",
    "LoadedState",
    "RecoveryProgress",
    "RecoveryReport",
    "ReplicaRole",
    "Tail",
]

log = logging.getLogger("stream_server.engine")

CHECKPOINT_BYTES = 64 * 1024 * 1024  # WAL size that triggers a checkpoint
HINT_REACH = 4096  # units a read hint may be behind the start and still be used


class Engine:
    def __init__(
        self,
        data_dir: Path,
        *,
        map_size: int = 1 << 33,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        fault_hook: Callable[[str], None] | None = None,
        replica: ReplicaRole | None = None,
    ) -> None:
        self.layout = Layout(Path(data_dir))
        self.segments = Segments(self.layout)
        self.map_size = map_size
        self.checkpoint_bytes = checkpoint_bytes
        self.meta: Metadata | None = None
        self.wal: WalWriter | None = None
        self.tails: dict[int, Tail] = {}
        self.damaged: dict[int, str] = {}
        self.failed: str | None = None
        self.progress = RecoveryProgress()  # of the recovery that open() runs
        self.lsn = 0
        self._dirty: set[int] = set()
        # Retention: bytes given back by punching so far (a metric), and how far each
        # stream's file is punched already (so a drop punches only what is new).
        self.reclaimed_bytes = 0
        self.punch_failures = 0
        self._punched: dict[int, int] = {}
        self._checkpoint_thread: threading.Thread | None = None
        self._checkpoint_lock = threading.Lock()
        # Fault hook: called with a stage name ("segments", "fsync", "wal", "commit")
        # so fault tests can stop the process between the steps of a batch, or
        # make the flush fail (see stream_server.faults).
        self.fault_hook = fault_hook
        # A replica set's hooks (engine/replica.py); None in single-node mode.
        self.replica: ReplicaRole | None = replica

    # ------------------------------------------------------------------ start

    def open(self) -> tuple[LoadedState, RecoveryReport]:
        started = time.monotonic()
        found = prepare(self.layout)
        self.meta = Metadata(self.layout.meta, self.map_size)
        recovery = Recovery(
            self.layout,
            self.meta,
            self.segments,
            self.write_metadata,
            headerless_wal=wal_headerless(found),
            progress=self.progress,
            replayed=self.replica.replayed if self.replica is not None else None,
        )
        state, report = recovery.run()
        self.tails, self.damaged, self.lsn = state.tails, recovery.damaged, recovery.lsn
        self.wal = WalWriter(self.layout.wal, retire_wal(self.layout, found))
        report.seconds = time.monotonic() - started
        return state, report

    # ------------------------------------------------------------------ write

    def commit(self, ops: list[Op]) -> BatchStats:
        """Make a batch durable. Runs on the writer thread only."""
        self._refuse_when_failed()
        if self.replica is not None:
            self.replica.check_writable()
        assert self.meta is not None and self.wal is not None
        t0 = time.perf_counter()
        self._resolve_drops(ops)
        batch = build(ops, self.tails, time.time_ns() // 1000)
        stats = batch.stats
        # 1. segment files (page cache) and 2. the WAL frame, appended: both undone
        # (truncated) if anything fails before the flush.
        undo: list[tuple[int, int]] = []
        wal_size = self.wal.size
        try:
            self._write_segments(batch.writes, undo)
            self._hook("segments")
            t1 = time.perf_counter()
            stats.write_seconds = t1 - t0
            frame = self._append_frame(batch, wal_size)
        except OSError as exc:
            self._undo_segments(undo)
            raise from_os_error("write failed", exc) from exc
        self._flush_batch()  # the batch is now durable
        t2 = time.perf_counter()
        stats.fsync_seconds = t2 - t1
        if self.replica is not None:
            # Durable here: ship it now, so the standbys' apply overlaps our LMDB
            # commit (engine/replica.py). From here the frame cannot be taken back.
            self.replica.committed(self.lsn, frame)
        # 3. metadata: the same changes the frame carries.
        self._commit_batch_meta(batch.changes, wal_size, undo)
        self._hook("commit")
        stats.commit_seconds = time.perf_counter() - t2
        # 4. publish.
        self._publish(batch.tails, batch.writes, batch.dropped, batch.heads)
        return stats

    def _write_segments(
        self, writes: dict[int, tuple[int, bytes]], undo: list[tuple[int, int]]
    ) -> None:
        """Each stream's new records at their file positions; ``undo`` collects where
        each file ended, for ``_undo_segments``."""
        for sid, (start, data) in writes.items():
            fd = self.segments.writer(sid)
            undo.append((sid, start))
            fsio.pwrite(fd, data, start)

    def _append_frame(self, batch: Batch, wal_size: int) -> bytes:
        """The batch's WAL frame under the next lsn (stamped with the replica position
        in a replica set), appended but not flushed; on OSError the lsn and the WAL
        are as they were."""
        assert self.wal is not None
        self.lsn += 1
        if self.replica is not None:
            self.replica.stamp(batch, self.lsn)
        frame = batch.frame(self.lsn)
        try:
            self.wal.append(frame)
        except OSError:
            self.lsn -= 1
            self._undo_wal(wal_size)
            raise
        return frame

    def _flush_batch(self) -> None:
        """fdatasync the WAL; a failure fails the engine closed (the page cache's state
        after a failed flush is unknown, so no retry can be trusted)."""
        assert self.wal is not None
        try:
            self._hook("fsync")
            self.wal.sync()
        except OSError as exc:
            self._fail(f"WAL fdatasync failed: {exc}")
            raise StorageFailed(f"storage failed closed: {self.failed}") from exc

    def _commit_batch_meta(
        self, changes: list[walmod.Entry], wal_size: int, undo: list[tuple[int, int]]
    ) -> None:
        """LMDB's commit of a batch whose frame is flushed. A failed commit takes the
        frame back (a single node) or fails the engine closed (a replica set, which
        shipped it already; or any failure that is not LMDB's)."""
        assert self.wal is not None
        try:
            self._hook("wal")
            self.write_metadata(changes)
        except BaseException as exc:
            if not isinstance(exc, lmdb.Error):
                # Unknown state between a durable frame and its commit: stop writing.
                self._fail(f"batch failed after its WAL flush: {exc!r}")
                raise
            if self.replica is not None:
                # Shipped already: the standbys may hold it, so it stays history and
                # this replica fails closed (it gives up the Lease) instead.
                self._fail(f"metadata commit failed after the frame was shipped: {exc!r}")
                raise StorageFailed(f"storage failed closed: {self.failed}") from exc
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
            raise from_lmdb_error("metadata commit failed", exc) from exc

    def _publish(
        self,
        tails: Mapping[int, Tail],
        written: Iterable[int],
        dropped: Iterable[int],
        heads: Mapping[int, int],
    ) -> None:
        """The last step of every commit, of a batch of ours or of frames applied from
        a primary (``commit_frames``): the new tails to readers, the files of dropped
        streams removed, the blocks below new retained starts given back, and a
        checkpoint when the WAL has grown enough. One path, so that a standby's
        engine is in the state its primary's is after the same frames."""
        self.tails.update(tails)
        self._dirty.update(written)
        for sid in dropped:
            self.tails.pop(sid, None)
            self._dirty.discard(sid)
            self._punched.pop(sid, None)
            self.segments.close(sid)
            fsio.unlink(self.segments.path(sid))
        # The new retained starts are durable (the WAL frame): only now may the bytes
        # below them go. A crash before or during the punch leaves the new start and
        # some blocks still allocated; recovery punches again.
        for sid, start_pos in heads.items():
            self._punch(sid, start_pos)
        assert self.wal is not None
        if self.wal.size >= self.checkpoint_bytes:
            self.start_checkpoint()

    # ------------------------------------------------ frames from a primary

    def append_frames(self, frames: list[bytes]) -> AppendedFrames | None:
        """The durable half of applying frames another engine's ``commit`` made (a
        primary's, shipped to this standby): their record writes to the segment files
        (each stream's adjacent writes as one), the frames appended to the WAL as they
        came (same lsns), one fdatasync. From here they survive a crash: recovery
        replays them into LMDB. ``commit_frames`` finishes them; None: no frames.

        ValueError for a damaged frame, before anything is written. Any later failure
        fails the engine closed: the frames are the primary's, and a restart (which
        replays the WAL) is the only safe retry. Runs on one thread while nothing else
        writes (a standby refuses batches of its own), and after the previous
        ``commit_frames`` has returned."""
        self._refuse_when_failed()
        assert self.wal is not None
        decoded, writes = split_frames(frames)
        if not decoded:
            return None
        written: set[int] = set()
        try:
            for sid, pos, data in coalesced(writes):
                fsio.pwrite(self.segments.writer(sid), data, pos)
                written.add(sid)
            self.wal.append(b"".join(frames))  # the frames as they came, one write
            self.wal.sync()
        except Exception as exc:
            self._fail(f"applying frames from the primary failed: {exc!r}")
            raise StorageFailed(f"storage failed closed: {self.failed}") from exc
        self.lsn = decoded[-1][0]
        return AppendedFrames(decoded, written)

    def commit_frames(self, appended: AppendedFrames) -> None:
        """The rest of applying frames: one LMDB transaction for all their metadata,
        then the same publish step as a batch of ours (``_publish``), its effects read
        from the frames' ``tails`` changes. A failure fails the engine closed; the
        frames stay durable in the WAL, which a restart replays."""
        try:
            self.write_metadata([e for _, changes in appended.frames for e in changes])
        except Exception as exc:
            self._fail(f"applying frames from the primary failed: {exc!r}")
            raise StorageFailed(f"storage failed closed: {self.failed}") from exc
        effects = tail_effects(appended.frames, self.tails)
        self._publish(effects.tails, appended.streams, effects.dropped, effects.heads)

    def write_metadata(self, entries: list[walmod.Entry], *, flush: bool = False) -> None:
        """One LMDB transaction (the map grown when full). Outside a batch, for state no
        frame carries (a replica position a set's base or a leave writes), only while
        nothing else writes. ``flush``: durable, meta page included, on return."""
        assert self.meta is not None
        if entries:
            while True:
                try:
                    with self.meta.write() as txn:
                        self.meta.apply(txn, entries)
                    break
                except lmdb.MapFullError:
                    self.meta.grow()
                    log.info("LMDB map grown to %d bytes", self.meta.env.info()["map_size"])
        if flush:
            self.meta.sync()

    def _refuse_when_failed(self) -> None:
        if self.failed:
            raise StorageFailed(f"storage failed closed: {self.failed}")

    def _resolve_drops(self, ops: list[Op]) -> None:
        """Name the index entries each retention drop makes useless (those below its
        new start), so that they are deleted in the same batch."""
        drops = [op for op in ops if isinstance(op, DropHead)]
        if not drops:
            return
        assert self.meta is not None
        with self.meta.env.begin() as txn:
            cur = txn.cursor(db=self.meta.dbs[DB_INDEX])
            for op in drops:
                tail = self.tails.get(op.stream_id)
                if tail is None or op.unit <= tail.start:
                    continue
                stop = index_key(op.stream_id, op.unit)
                keys: list[bytes] = []
                if cur.set_range(index_key(op.stream_id, 0)):
                    for key in cur.iternext(values=False):
                        if key >= stop:
                            break
                        keys.append(bytes(key))
                op.index_keys = keys

    def _punch(self, sid: int, start_pos: int) -> None:
        """Give back the blocks below a durable retained start. A file system that
        cannot punch keeps them (counted, logged once): nothing is lost but space."""
        self._hook("punch")
        done = self._punched.get(sid, 0)
        try:
            upto, punched = self.segments.punch_below(sid, start_pos, done)
        except OSError as exc:
            self.punch_failures += 1
            if self.punch_failures == 1:
                log.warning("retention cannot give disk space back here: %s", exc)
            return
        if upto > done:
            self.reclaimed_bytes += punched
            self._punched[sid] = upto
            self._dirty.add(sid)

    def _undo_segments(self, undo: list[tuple[int, int]]) -> None:
        for sid, start in undo:
            try:
                fsio.ftruncate(self.segments.writer(sid), start)
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

    def _checkpoint(self, dirty: set[int], upto_number: int, workers: int = 1) -> None:
        with self._checkpoint_lock:
            try:
                fsio.fdatasync_paths([self.segments.path(sid) for sid in dirty], workers)
                for sub in {self.segments.path(s).parent for s in dirty}:
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
                self._checkpoint(dirty, number, fsio.FLUSH_WORKERS)
            else:
                self.wal.close()
            self.wal = None
        self.segments.close_all()
        if self.meta is not None:
            self.meta.close()
            self.meta = None

    # ------------------------------------------------------------------- read

    def keyed_values(self, space: str) -> dict[str, bytes]:
        """Every committed keyed value of ``space`` (``ops.PutKeyedValue``), by key, from one
        LMDB read transaction. Runs on any thread."""
        assert self.meta is not None
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
                first=(tail.start_pos, tail.start) if tail else None,
            )

    def retention_point(  # noqa: C901 - the bounds of a retention cut, each beside the others
        self, sid: int, *, min_pos: int, cutoff_us: int | None, max_unit: int
    ) -> tuple[int, int] | None:
        """Where a drop may move the retained start: the first record that starts at
        or after file position ``min_pos`` and, with ``cutoff_us``, was committed at or
        after that time; never past unit ``max_unit`` (the tail the caller saw).
        Returns (unit, file position), or None when the start stays.

        Reads record headers only (never payloads), from the index entry at or
        below ``min_pos``, so the cost is the records dropped plus one granule.
        Runs on any thread; it looks at the committed log, which only grows.
        """
        tail = self.tails.get(sid)
        if tail is None or sid in self.damaged:
            return None
        file_len, tail_unit = tail.file_len, tail.unit
        pos, unit = self._index_floor(sid, None, max_pos=max(min_pos, tail.start_pos))
        if pos < tail.start_pos:
            pos, unit = tail.start_pos, tail.start
        max_unit = min(max_unit, tail_unit)
        unpack = RECORD_HEADER.unpack_from
        fd = fsio.open_read(self.segments.path(sid))
        try:
            while pos < file_len and unit < max_unit:
                buf = fsio.pread(fd, min(256 * 1024, file_len - pos), pos)
                off = 0
                while off + RECORD_HEADER_SIZE <= len(buf):
                    _, plen, rkind, flags, pidlen, rstart, ts = unpack(buf, off)
                    if rstart != unit:  # not a record start: drop nothing rather than guess
                        return None
                    if pos + off >= min_pos and (cutoff_us is None or ts >= cutoff_us):
                        return self._point(tail, unit, pos + off)
                    size = RECORD_HEADER_SIZE + plen
                    if flags & FLAG_PRODUCER:
                        size += PRODUCER_TAIL.size + pidlen
                    nxt = unit + (1 if rkind == KIND_JSON else plen)
                    if nxt > max_unit:
                        return self._point(tail, unit, pos + off)
                    unit = nxt
                    off += size
                    if off > len(buf):  # the payload runs past the buffer: skip it
                        break
                if off == 0:
                    return None  # a header cut by the end of the log: cannot happen
                pos += off
        finally:
            fsio.close(fd)
        return self._point(tail, unit, min(pos, file_len))

    def first_record_time(self, sid: int) -> tuple[int, int] | None:
        """(file position, commit time in µs) of the first retained record, or None when
        the stream holds none. One small read; runs on any thread."""
        tail = self.tails.get(sid)
        if tail is None or tail.start >= tail.unit or sid in self.damaged:
            return None
        pos = tail.start_pos
        head = self.segments.read(sid, pos, RECORD_HEADER_SIZE)
        if len(head) < RECORD_HEADER_SIZE:
            return None
        return pos, RECORD_HEADER.unpack(head)[6]

    @staticmethod
    def _point(tail: Tail, unit: int, pos: int) -> tuple[int, int] | None:
        return (unit, pos) if unit > tail.start else None

    def _below_start(self, sid: int, pos: int) -> None:
        """HeadDropped if ``pos`` is below the retained start: a drop overtook this read
        (it found the bytes as they were punched), which is not damage."""
        tail = self.tails.get(sid)
        if tail is not None and pos < tail.start_pos:
            raise HeadDropped(tail.start)

    def record_end(self, sid: int, unit: int) -> int:
        """The unit just past the record that covers ``unit``."""
        pos, _ = self._index_floor(sid, unit)
        fd = fsio.open_read(self.segments.path(sid))
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
        return self._index_floor(sid, start)[0]

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
        fd = fsio.open_read(self.segments.path(sid))
        try:
            while cur < stop and total < max_bytes:
                buf = fsio.pread(fd, chunk, pos)
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
            fsio.close(fd)
        return out, cur, (cur, pos)
