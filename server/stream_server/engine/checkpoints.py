"""Checkpoints: the WAL rotated, and what its old files cover made durable elsewhere.

A batch is durable once its WAL frame is flushed; its segment writes and LMDB
commit are in the page cache only. A checkpoint (when the WAL has grown past
a size or a number of frames, or holds a frame older than an age: ``Triggers``;
and at a clean shutdown) commits the tails that wait
for an LMDB transaction (``meta_writes.py``), then flushes the segment files
written since the last one and LMDB's meta page on another thread, then
deletes the WAL files that covered them: recovery replays only what came
after. A failed flush fails the engine closed (``fail_closed.py``): which
pages reached the disk is then unknown. With an object-store archive, old files
holding a frame the archive lacks are moved into its spool instead of deleted
(``wal_keep.py``).
"""

from __future__ import annotations

import threading
import time

from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_server.engine import fsio, wal_keep
from stream_server.engine.fail_closed import FailClosed
from stream_server.engine.meta_writes import MetaWriter
from stream_server.engine.segments import Segments
from stream_server.engine.wal_writer import WalWriter

CHECKPOINT_BYTES = 64 * 1024 * 1024  # WAL size that triggers a checkpoint
CHECKPOINT_FRAMES = 10_000  # or frames in it (each replayed by a recovery)
CHECKPOINT_SECONDS = float("inf")  # or its oldest frame's age (the server sets one)


class Triggers:
    """When the WAL holds enough to checkpoint: ``size`` bytes of it, ``frames`` frames
    (recovery replays each: a WAL of small frames under the size bound made a kill -9's
    restart at 1M streams take 102 s, the benchmark's ``many`` workload), or a frame
    older than ``seconds``. A plain class rather than a dataclass, whose generated
    methods are compiled at every start."""

    __slots__ = ("frames", "seconds", "size")

    def __init__(
        self,
        size: int = CHECKPOINT_BYTES,
        frames: int = CHECKPOINT_FRAMES,
        seconds: float = CHECKPOINT_SECONDS,
    ) -> None:
        self.size = size
        self.frames = frames
        self.seconds = seconds

    def due(self, wal: WalWriter, lsn: int) -> bool:
        """Whether ``wal``, whose last frame is ``lsn``, holds enough."""
        if not wal.first_lsn:
            return False
        return (
            wal.size >= self.size
            or lsn - wal.first_lsn + 1 >= self.frames
            or time.monotonic() - wal.first_at >= self.seconds
        )


class Checkpointer:
    """The engine's checkpoints over an open data directory: which streams' files were
    written since the last one, and the thread that flushes them. The WAL file being
    written stays the engine's; ``start`` hands it the next one."""

    def __init__(
        self,
        layout: Layout,
        segments: Segments,
        writer: MetaWriter,
        faults: FailClosed,
        triggers: Triggers,
        archive_floor: wal_keep.ArchiveFloor | None = None,
    ) -> None:
        self.layout = layout
        self.segments = segments
        self.writer = writer  # its LMDB environment is the one a checkpoint flushes
        self.faults = faults
        self.triggers = triggers
        # An object-store archive's archived lsn: old WAL files holding a frame above
        # it go to the archive's spool instead of away (wal_keep.py).
        self.archive_floor = archive_floor
        self.dirty: set[int] = set()  # streams whose files were written since the last one
        self.thread: threading.Thread | None = None  # the running checkpoint's
        self._lock = threading.Lock()  # one flush at a time (the last one at close)

    def start(self, wal: WalWriter, lsn: int) -> WalWriter:
        """Rotate ``wal`` (whose last frame is ``lsn``) and flush, on another thread,
        what its files cover; returns the WAL to write next (``wal`` itself when no
        checkpoint starts: one runs already, or the tails that wait failed to commit)."""
        if self.thread is not None and self.thread.is_alive():
            return wal
        if not self.writer.commit_deferred(lsn):  # old files go only once LMDB holds them
            return wal
        new = wal.rotate()
        dirty, self.dirty = self.dirty, set()
        self.thread = threading.Thread(
            target=self._flush,
            args=(dirty, wal.number, 1, lsn),
            name="checkpoint",
            daemon=True,
        )
        self.thread.start()
        return new

    def start_if_due(self, wal: WalWriter, lsn: int) -> WalWriter:
        """``start`` when ``triggers`` say so and the engine has not failed."""
        if self.faults.failed or not self.triggers.due(wal, lsn):
            return wal
        return self.start(wal, lsn)

    def finish(self, wal: WalWriter, lsn: int) -> None:
        """At a clean stop: wait for a running checkpoint, close ``wal`` and run a last
        one on every flush worker, leaving an empty WAL for a fast start (none when the
        engine failed closed: recovery replays the WAL then)."""
        if self.thread is not None:
            self.thread.join()
        if self.faults.failed or not self.writer.commit_deferred(lsn):
            wal.close()
            return
        number = wal.number
        wal.close()
        dirty, self.dirty = self.dirty, set()
        self._flush(dirty, number, fsio.FLUSH_WORKERS, lsn)

    def _flush(self, dirty: set[int], upto_number: int, workers: int, last_lsn: int) -> None:
        """Flush the files of ``dirty`` and LMDB's meta page, then retire the WAL files
        up to ``upto_number`` (whose last frame is ``last_lsn``)."""
        with self._lock:
            try:
                paths = [self.segments.path(sid) for sid in dirty]  # made once: 1M costs seconds
                fsio.fdatasync_paths(paths, workers)
                for sub in {p.parent for p in paths}:
                    if sub.exists():
                        fsio.fsync_dir(sub)
                self.writer.meta.sync()
                old = [p for p in walmod.wal_files(self.layout.wal) if int(p.stem) <= upto_number]
                floor = self.archive_floor
                wal_keep.retire(self.layout, old, floor is not None and floor() < last_lsn)
            except OSError as exc:
                self.faults.fail(f"checkpoint flush failed: {exc}")
