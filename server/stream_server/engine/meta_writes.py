"""The engine's LMDB writes, and tails that wait for the next batch's transaction.

A batch is durable once its WAL frame is flushed (``engine.py``); its LMDB
transaction only makes the same changes readable from LMDB (by a worker's check
of a retained start, the Spark reader, a copy) and spares recovery their
replay. Each transaction costs a commit and an fdatasync of its own, and under
load most batches change nothing in LMDB but the tails of the streams they
append to. So a batch whose changes are only such tails, with the next batch
already waiting behind it, keeps them here (the newest value per stream) for a
later transaction: at most ``MAX_DEFERRED`` batches in a row do so, and any
LMDB write takes what waits first, in order before its own changes (issue 28:
the writer's cost per append is the serial part of ``--workers N``).

What stays true:

- Durability: every deferred frame is in the WAL, recovery replays every frame
  since the last checkpoint, and a checkpoint commits what waits before it
  rotates the WAL (``Checkpointer.start``), as a clean stop does.
- The writer's own reads: they go by the tails it publishes, in memory.
- Readers of LMDB: one read transaction is still a consistent cut, at most
  ``MAX_DEFERRED`` batches old while the load lasts, and the newest once it
  stops (the last batch before a pause has none behind it, so it commits what
  waits, before its acknowledgement; should the batch behind fail instead, what
  waits goes with the next commit or checkpoint). A batch that moves a retained
  start, or drops a stream, is never deferred, so LMDB's retained starts are
  never behind.
- A copy's position (``snapshot.py``): ``meta_lsn``, the last frame LMDB holds
  all of, not the engine's lsn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import lmdb

from stream_format import wal as walmod
from stream_format.meta import DB_TAILS
from stream_server.engine.batch import Batch
from stream_server.engine.fail_closed import FailClosed
from stream_server.engine.metadata import Metadata

log = logging.getLogger("stream_server.engine")

# Batches in a row whose tails may wait: how far LMDB may be behind the WAL under
# load (each batch is one frame recovery would replay anyway).
MAX_DEFERRED = 16


class MetaWriter:
    """The engine's LMDB transactions over an open environment, and the tails waiting
    for one. Built by ``Engine.open`` once LMDB is open; runs on the writer thread (and
    on the thread that opens or closes the engine, while nothing else writes)."""

    def __init__(self, meta: Metadata, faults: FailClosed) -> None:
        self.meta = meta
        self.faults = faults
        # The last frame whose changes LMDB holds all of (a copy's position on a node
        # that keeps no lsn in LMDB): the engine sets it where a batch's or frames'
        # commit finishes, and recovery's end.
        self.meta_lsn = 0
        self._deferred: dict[bytes, walmod.Entry] = {}  # tails key -> its newest put
        self._deferred_frames = 0  # batches whose tails wait

    @property
    def waiting(self) -> int:
        """How many batches' tails wait for a transaction."""
        return self._deferred_frames

    def write(self, entries: list[walmod.Entry], *, flush: bool = False) -> None:
        """One LMDB transaction (the map grown when full), with the tails that wait put
        first. Outside a batch, for state no frame carries (a replica position a set's
        base or a leave writes), only while nothing else writes. ``flush``: durable,
        meta page included, on return."""
        waiting = self._deferred
        if waiting:
            entries = [*waiting.values(), *entries]
        if entries:
            while True:
                try:
                    with self.meta.write() as txn:
                        self.meta.apply(txn, entries)
                    break
                except lmdb.MapFullError:
                    self.meta.grow()
                    log.info("LMDB map grown to %d bytes", self.meta.env.info()["map_size"])
        if waiting:
            self._deferred, self._deferred_frames = {}, 0
        if flush:
            self.meta.sync()

    def deferrable(self, batch: Batch, more: Callable[[], bool] | None) -> bool:
        """Whether ``batch`` may leave its changes for a later transaction: tails only,
        no retained start moved, no stream dropped, fewer than ``MAX_DEFERRED`` waiting
        already, and (asked last: it is another thread's state) a batch behind it."""
        if more is None or batch.heads or batch.dropped or self._deferred_frames >= MAX_DEFERRED:
            return False
        for entry in batch.changes:
            if entry[1] != DB_TAILS or entry[0] != walmod.PUT:
                return False
        return more()

    def defer(self, changes: list[walmod.Entry]) -> None:
        """Keep a batch's tails (the newest per stream) for the next transaction."""
        waiting = self._deferred
        for entry in changes:
            waiting[entry[2]] = entry
        self._deferred_frames += 1

    def commit_deferred(self, lsn: int) -> bool:
        """Commit what waits (before a checkpoint or a clean stop lets WAL files go), LMDB
        then holding every frame up to ``lsn``; False when that failed, which fails the
        engine closed: the WAL keeps it all."""
        if not self._deferred:
            return True
        try:
            self.write([])
        except Exception as exc:
            self.faults.fail(f"committing the tails that waited failed: {exc!r}")
            return False
        self.meta_lsn = lsn
        return True
