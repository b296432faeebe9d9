"""The storage engine: durable batches, positional reads, checkpoints and recovery.

One module over 400 lines, kept whole: the engine's one object, its batch path and
its recovery; what can stand alone (the log reader, the metadata writer, the
checkpointer, the WAL) already lives in modules of its own.

Path of one batch (called from the single writer thread):

1. build it (``batch.build``): the records for each segment file and one list
   of metadata changes;
2. write the records to the segment files (page cache only); a small log's
   records go into LMDB with step 4 instead (``Segments.place``, format 5);
3. write one WAL frame holding the records and the metadata changes, and
   fdatasync it: from here the batch survives a crash; in a replica set the
   frame is shipped to the standbys now, so their apply overlaps step 4;
4. commit the same metadata changes to LMDB (tails, index, producers, streams);
   a batch that changes only tails, with the next one waiting behind it, leaves
   them to that one's transaction (``meta_writes.py``);
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

The engine holds what a batch changes (the lsn, the WAL file written, the
published tails) and owns a part per concern, each an object with its own
state that a test can build alone: the fail-closed state (``FailClosed``), the
reads of the committed log (``LogReads``, which a worker builds too), retention's
drops (``HeadDrops``), and, once LMDB is open, its writes (``MetaWriter``) and the
checkpoints (``Checkpointer``). Its public face (the reads, ``failed``,
``meta_lsn``, ``write_metadata``, ...) forwards to them. Recovery, segments, batch
building and the frames' pure steps are modules of their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import lmdb

from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_server.engine import dir_lock, fsio, wal_keep
from stream_server.engine.batch import Batch, BatchStats, Tail, build
from stream_server.engine.checkpoints import (
    CHECKPOINT_BYTES,
    CHECKPOINT_FRAMES,
    CHECKPOINT_SECONDS,
    Checkpointer,
    Triggers,
)
from stream_server.engine.data_dir import prepare, retire_wal, wal_headerless
from stream_server.engine.fail_closed import FailClosed
from stream_server.engine.frames import (
    AppendedFrames,
    ReplicaRole,
    coalesced,
    split_frames,
    tail_effects,
)
from stream_server.engine.head_drops import HeadDrops
from stream_server.engine.log_reads import LogReads
from stream_server.engine.meta_writes import MetaWriter
from stream_server.engine.metadata import Metadata
from stream_server.engine.ops import Op
from stream_server.engine.recovery import (
    LoadedState,
    Recovery,
    RecoveryProgress,
    RecoveryReport,
)
from stream_server.engine.segments import INLINE_MAX, Segments, inline_changes
from stream_server.engine.storage_errors import from_lmdb_error, from_os_error
from stream_server.engine.wal_writer import WalWriter

__all__ = [
    "CHECKPOINT_BYTES",
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


class Engine:
    def __init__(
        self,
        data_dir: Path,
        *,
        map_size: int = 1 << 33,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        checkpoint_frames: int = CHECKPOINT_FRAMES,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        fault_hook: Callable[[str], None] | None = None,
        replica: ReplicaRole | None = None,
        archive_floor: wal_keep.ArchiveFloor | None = None,
        inline_max: int = INLINE_MAX,
    ) -> None:
        self.layout = Layout(Path(data_dir))
        # ``inline_max``: the longest log kept in LMDB (segments.py); 0 keeps every log
        # in a file, for tests of the files themselves.
        self.segments = Segments(self.layout, inline_max)
        self.map_size = map_size
        self.triggers = Triggers(checkpoint_bytes, checkpoint_frames, checkpoint_seconds)
        self.meta: Metadata | None = None  # LMDB, open() to close()
        self.wal: WalWriter | None = None  # the WAL file frames go to, open() to close()
        self.tails: dict[int, Tail] = {}  # as published (``_publish``)
        self.progress = RecoveryProgress()  # of the recovery that open() runs
        self.lsn = 0
        # The lsn of the last frame whose commit finished (LMDB included): a frame at
        # or below it is never taken back, so the archive may copy it.
        self.published_lsn = 0
        # Why the engine failed closed, and the fault hook: called with a stage name
        # ("segments", "fsync", "wal", "commit") so fault tests can stop the process
        # between the steps of a batch, or make the flush fail (stream_server.faults).
        self.faults = FailClosed(fault_hook)
        self.reads = LogReads(self.segments, self.tails)
        self.drops = HeadDrops(self.reads, self.faults.hook)
        self.writer: MetaWriter | None = None  # open() to close(), as LMDB
        self.checkpoints: Checkpointer | None = None  # open() to close()
        # The reads, as the engine's own methods (the stream layer's, retention's).
        self.keyed_values = self.reads.keyed_values
        self.stored_stream = self.reads.stored_stream
        self.stored_paths = self.reads.stored_paths
        self.stored_stream_count = self.reads.stored_stream_count
        self.record_end = self.reads.record_end
        self.read = self.reads.read
        self.retention_point = self.drops.retention_point
        self.first_record_time = self.drops.first_record_time
        # A replica set's hooks (engine/replica.py); None in single-node mode.
        self.replica: ReplicaRole | None = replica
        # An object-store archive's archived lsn: WAL holding frames above it is kept
        # (wal_keep.py). None without an archive: WAL is deleted as before.
        self.archive_floor = archive_floor
        self.lock = dir_lock.Held(self.layout.root)  # the directory's, open() to close()

    # ------------------------------------------------- the parts' state, as it was named

    @property
    def failed(self) -> str | None:
        """Why the engine failed closed; None while it has not."""
        return self.faults.failed

    def _fail(self, reason: str) -> None:
        """Fail closed (``FailClosed.fail``): the replication tests' way to stop writes."""
        self.faults.fail(reason)

    @property
    def meta_lsn(self) -> int:
        """The last frame whose changes LMDB holds all of (``meta_writes.py``)."""
        return 0 if self.writer is None else self.writer.meta_lsn

    @property
    def reclaimed_bytes(self) -> int:
        return self.drops.reclaimed_bytes

    @property
    def checkpoint_frames(self) -> int:
        return self.triggers.frames

    @property
    def checkpoint_seconds(self) -> float:
        return self.triggers.seconds

    @property
    def _checkpoint_thread(self) -> threading.Thread | None:
        """The checkpoint running on its thread, if any (tests wait for it)."""
        return None if self.checkpoints is None else self.checkpoints.thread

    # ------------------------------------------------------------------ start

    def open(self) -> tuple[LoadedState, RecoveryReport]:
        self.lock.take()  # before anything is read (dir_lock.py); close() gives it back
        try:
            return self._open()
        except BaseException:
            self.lock.give_back()
            raise

    def _open(self) -> tuple[LoadedState, RecoveryReport]:
        started = time.monotonic()
        found = prepare(self.layout)
        self.meta = self.segments.meta = Metadata(self.layout.meta, self.map_size)
        self.writer = writer = MetaWriter(self.meta, self.faults)
        recovery = Recovery(
            self.layout,
            self.meta,
            self.segments,
            writer.write,
            headerless_wal=wal_headerless(found),
            progress=self.progress,
            replayed=self.replica.replayed if self.replica is not None else None,
        )
        state, report = recovery.run()
        self.tails = self.reads.tails = state.tails  # one dict: the reads see what is published
        self.reads.damaged = recovery.damaged
        self.lsn = recovery.lsn
        keep = None
        if self.archive_floor is not None:
            if self.replica is None:  # a replica set's position carries its lsn
                self.lsn = max(self.lsn, wal_keep.stored_lsn(self.meta))
            keep = self.archive_floor() < recovery.lsn
        self.published_lsn = writer.meta_lsn = self.lsn
        self.wal = WalWriter(self.layout.wal, retire_wal(self.layout, found, keep))
        self.checkpoints = Checkpointer(
            self.layout, self.segments, writer, self.faults, self.triggers, self.archive_floor
        )
        report.seconds = time.monotonic() - started
        return state, report

    # ------------------------------------------------------------------ write

    def commit(self, ops: list[Op], more: Callable[[], bool] | None = None) -> BatchStats:
        """Make a batch durable. Runs on the writer thread only. ``more``: whether
        another batch waits behind this one, whose LMDB transaction may then take this
        one's tails (``meta_writes.py``)."""
        self.faults.refuse_when_failed()
        if self.replica is not None:
            self.replica.check_writable()
        writer = self.writer
        assert writer is not None and self.wal is not None
        t0 = time.perf_counter()
        self.drops.resolve(ops)
        batch = build(ops, self.tails, time.time_ns() // 1000)
        self.segments.place(batch.writes, batch.changes)
        stats = batch.stats
        # 1. segment files (page cache) and 2. the WAL frame, appended: both undone
        # (truncated) if anything fails before the flush.
        undo: list[tuple[int, int]] = []
        wal_size = self.wal.size
        try:
            self._write_segments(batch.writes, undo)
            self.faults.hook("segments")
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
            stats.term = self.replica.term
        # 3. metadata: the same changes the frame carries, or, tails only with a batch
        # behind it, kept for that batch's transaction.
        if writer.deferrable(batch, more):
            self.faults.hook("wal")  # the same point between the flush and LMDB
            writer.defer(batch.changes)
        else:
            self._commit_batch_meta(writer, batch.changes, wal_size, undo)
            writer.meta_lsn = self.lsn
        self.faults.hook("commit")
        stats.commit_seconds = time.perf_counter() - t2
        # 4. publish.
        self._publish(batch.tails, batch.writes, batch.dropped, batch.heads, batch.changes)
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
        elif self.archive_floor is not None:
            wal_keep.stamp(batch.changes, self.lsn)
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
            self.faults.hook("fsync")
            self.wal.sync()
        except OSError as exc:
            self.faults.fail(f"WAL fdatasync failed: {exc}")
            raise self.faults.error() from exc

    def _commit_batch_meta(
        self,
        writer: MetaWriter,
        changes: list[walmod.Entry],
        wal_size: int,
        undo: list[tuple[int, int]],
    ) -> None:
        """LMDB's commit of a batch whose frame is flushed. A failed commit takes the
        frame back (a single node) or fails the engine closed (a replica set, which
        shipped it already; or any failure that is not LMDB's)."""
        assert self.wal is not None
        faults = self.faults
        try:
            faults.hook("wal")
            writer.write(changes)
        except BaseException as exc:
            if not isinstance(exc, lmdb.Error):
                # Unknown state between a durable frame and its commit: stop writing.
                faults.fail(f"batch failed after its WAL flush: {exc!r}")
                raise
            if self.replica is not None:
                # Shipped already: the standbys may hold it, so it stays history and
                # this replica fails closed (it gives up the Lease) instead.
                faults.fail(f"metadata commit failed after the frame was shipped: {exc!r}")
                raise faults.error() from exc
            # The frame is durable but unacknowledged; take it back so that a
            # restart does not replay what we are about to report as failed.
            try:
                self._undo_wal(wal_size)
                self.wal.sync()
            except OSError as exc2:
                faults.fail(f"metadata commit failed and the WAL could not be rolled back: {exc2}")
                raise faults.error() from exc
            self.lsn -= 1
            self._undo_segments(undo)
            raise from_lmdb_error("metadata commit failed", exc) from exc

    def _publish(
        self,
        tails: Mapping[int, Tail],
        written: Iterable[int],
        dropped: Iterable[int],
        heads: Mapping[int, int],
        changes: list[walmod.Entry],
    ) -> None:
        """The last step of every commit, of a batch of ours or of frames applied from
        a primary (``commit_frames``): the new tails to readers, the files of dropped
        streams removed, the blocks below new retained starts given back, and a
        checkpoint when the WAL has grown enough. One path, so that a standby's
        engine is in the state its primary's is after the same frames. The streams
        kept inline are known before the tails that let readers at them."""
        put, gone = inline_changes(changes)
        if put or gone:
            self.segments.inline |= put
            self.segments.inline -= gone
        checkpoints = self.checkpoints
        assert checkpoints is not None and self.wal is not None
        self.tails.update(tails)
        self.published_lsn = self.lsn
        dirty = checkpoints.dirty
        dirty.update(written)
        for sid in dropped:
            self.tails.pop(sid, None)
            dirty.discard(sid)
            self.drops.forget(sid)
            self.segments.close(sid)
            fsio.unlink(self.segments.path(sid))
        # The new retained starts are durable (the WAL frame): only now may the bytes
        # below them go. A crash before or during the punch leaves the new start and
        # some blocks still allocated; recovery punches again.
        for sid, start_pos in heads.items():
            if self.drops.punch(sid, start_pos):
                dirty.add(sid)
        if self.triggers.due(self.wal, self.lsn):
            self.wal = checkpoints.start(self.wal, self.lsn)

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
        self.faults.refuse_when_failed()
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
            self.faults.fail(f"applying frames from the primary failed: {exc!r}")
            raise self.faults.error() from exc
        self.lsn = decoded[-1][0]
        return AppendedFrames(decoded, written)

    def commit_frames(self, appended: AppendedFrames) -> None:
        """The rest of applying frames: one LMDB transaction for all their metadata,
        then the same publish step as a batch of ours (``_publish``), its effects read
        from the frames' ``tails`` changes. A failure fails the engine closed; the
        frames stay durable in the WAL, which a restart replays."""
        changes = [e for _, frame_changes in appended.frames for e in frame_changes]
        writer = self.writer
        assert writer is not None
        try:
            writer.write(changes)
        except Exception as exc:
            self.faults.fail(f"applying frames from the primary failed: {exc!r}")
            raise self.faults.error() from exc
        writer.meta_lsn = self.lsn
        effects = tail_effects(appended.frames, self.tails)
        self._publish(effects.tails, appended.streams, effects.dropped, effects.heads, changes)

    def _undo_segments(self, undo: list[tuple[int, int]]) -> None:
        for sid, start in undo:
            try:
                fsio.ftruncate(self.segments.writer(sid), start)
            except OSError as exc:  # the bytes stay past the committed tail: harmless
                log.warning("could not trim stream id %d after a failed batch: %s", sid, exc)

    def _undo_wal(self, size: int) -> None:
        assert self.wal is not None
        self.wal.truncate_to(size)

    # ------------------------------------------------ LMDB, checkpoints, close

    def write_metadata(self, entries: list[walmod.Entry], *, flush: bool = False) -> None:
        """One LMDB transaction outside a batch (``MetaWriter.write``), for state no
        frame carries, only while nothing else writes."""
        assert self.writer is not None, "the engine is not open"
        self.writer.write(entries, flush=flush)

    def checkpoint_if_due(self) -> None:
        """A checkpoint when due, from the thread that writes batches while no batch is
        written (``CommitPipeline``'s timer: the age comes due with no batch)."""
        if self.checkpoints is not None and self.wal is not None:
            self.wal = self.checkpoints.start_if_due(self.wal, self.lsn)

    def close(self) -> None:
        """Clean shutdown: a final checkpoint leaves an empty WAL for a fast start."""
        if self.checkpoints is not None and self.wal is not None:
            self.checkpoints.finish(self.wal, self.lsn)
        self.wal = None
        self.segments.close_all()
        if self.meta is not None:
            self.meta.close()
            self.meta = None
        self.lock.give_back()
