"""Checkpoints: the WAL rotated, and what its old files cover made durable elsewhere.

A batch is durable once its WAL frame is flushed; its segment writes and LMDB
commit are in the page cache only. A checkpoint (when the WAL has grown past
``checkpoint_bytes`` or ``checkpoint_frames``, or holds a frame older than
``checkpoint_seconds``, and at a clean shutdown) commits the tails that wait
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
from stream_server.engine import dir_lock, fsio, wal_keep
from stream_server.engine.meta_writes import MetaWrites
from stream_server.engine.metadata import Metadata
from stream_server.engine.segments import Segments
from stream_server.engine.wal_writer import WalWriter


class Checkpoints(MetaWrites):
    """Mixed into ``Engine``: its checkpoints and its clean close."""

    layout: Layout
    segments: Segments
    meta: Metadata | None
    wal: WalWriter | None
    _dirty: set[int]  # streams written since the last checkpoint
    checkpoint_bytes: int
    checkpoint_frames: int
    checkpoint_seconds: float
    _checkpoint_thread: threading.Thread | None
    _checkpoint_lock: threading.Lock
    lsn: int
    archive_floor: wal_keep.ArchiveFloor | None
    lock: dir_lock.Held

    def checkpoint_due(self) -> bool:
        """Whether the WAL holds enough to checkpoint: ``checkpoint_bytes`` of it,
        ``checkpoint_frames`` frames (recovery replays each: a WAL of small frames
        under the size bound made a kill -9's restart at 1M streams take 102 s, the
        benchmark's ``many`` workload), or a frame older than ``checkpoint_seconds``."""
        wal = self.wal
        assert wal is not None
        if not wal.first_lsn:
            return False
        return (
            wal.size >= self.checkpoint_bytes
            or self.lsn - wal.first_lsn + 1 >= self.checkpoint_frames
            or time.monotonic() - wal.first_at >= self.checkpoint_seconds
        )

    def checkpoint_if_due(self) -> None:
        """``start_checkpoint`` when due, from the thread that writes batches while no
        batch is written (``CommitPipeline``'s timer: the age comes due with no batch)."""
        if not self.failed and self.wal is not None and self.checkpoint_due():
            self.start_checkpoint()

    def start_checkpoint(self) -> None:
        """Rotate the WAL and flush, on another thread, what the old files cover."""
        if self._checkpoint_thread is not None and self._checkpoint_thread.is_alive():
            return
        if not self._commit_deferred():  # the old files may go only once LMDB holds them
            return
        assert self.wal is not None
        old_wal = self.wal
        self.wal = old_wal.rotate()
        dirty, self._dirty = self._dirty, set()
        self._checkpoint_thread = threading.Thread(
            target=self._checkpoint,
            args=(dirty, old_wal.number, 1, self.lsn),
            name="checkpoint",
            daemon=True,
        )
        self._checkpoint_thread.start()

    def _checkpoint(
        self, dirty: set[int], upto_number: int, workers: int = 1, last_lsn: int = 0
    ) -> None:
        """``last_lsn``: the last frame of the files up to ``upto_number``."""
        with self._checkpoint_lock:
            try:
                paths = [self.segments.path(sid) for sid in dirty]  # made once: 1M costs seconds
                fsio.fdatasync_paths(paths, workers)
                for sub in {p.parent for p in paths}:
                    if sub.exists():
                        fsio.fsync_dir(sub)
                assert self.meta is not None
                self.meta.sync()
                old = [p for p in walmod.wal_files(self.layout.wal) if int(p.stem) <= upto_number]
                floor = self.archive_floor
                wal_keep.retire(self.layout, old, floor is not None and floor() < last_lsn)
            except OSError as exc:
                self._fail(f"checkpoint flush failed: {exc}")

    def close(self) -> None:
        """Clean shutdown: a final checkpoint leaves an empty WAL for a fast start."""
        if self._checkpoint_thread is not None:
            self._checkpoint_thread.join()
        if self.wal is not None:
            if not self.failed and self._commit_deferred():
                number = self.wal.number
                self.wal.close()
                dirty, self._dirty = self._dirty, set()
                self._checkpoint(dirty, number, fsio.FLUSH_WORKERS, self.lsn)
            else:
                self.wal.close()
            self.wal = None
        self.segments.close_all()
        if self.meta is not None:
            self.meta.close()
            self.meta = None
        self.lock.give_back()
