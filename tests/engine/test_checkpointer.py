"""The checkpointer alone (``engine/checkpoints.py``), over a real data directory and
no engine: the WAL handed to it rotates, the old files go once what they cover is
flushed, one checkpoint runs at a time, and a failure anywhere keeps the WAL that
recovery would need."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_format.meta import DB_TAILS, id_key
from stream_server.engine import fsio
from stream_server.engine.checkpoints import Checkpointer, Triggers
from stream_server.engine.fail_closed import FailClosed
from stream_server.engine.meta_writes import MetaWriter
from stream_server.engine.metadata import Metadata
from stream_server.engine.segments import Segments
from stream_server.engine.wal_writer import WalWriter


class Directory:
    """A data directory's parts as an engine's open would build them."""

    def __init__(self, root: Path) -> None:
        self.layout = Layout(root)
        fsio.mkdir(self.layout.wal)
        self.meta = Metadata(self.layout.meta, 1 << 20)
        self.segments = Segments(self.layout)
        self.segments.meta = self.meta
        self.faults = FailClosed()
        self.writer = MetaWriter(self.meta, self.faults)
        self.checkpoints = Checkpointer(
            self.layout, self.segments, self.writer, self.faults, Triggers()
        )
        self.wal = WalWriter(self.layout.wal, 1)

    def frame(self, lsn: int) -> None:
        self.wal.append(walmod.encode_frame(lsn, []))
        self.wal.sync()

    def wal_numbers(self) -> list[int]:
        return [walmod.file_number(p) for p in walmod.wal_files(self.layout.wal)]

    def settled(self) -> None:
        if self.checkpoints.thread is not None:
            self.checkpoints.thread.join()


@pytest.fixture
def d(tmp_path: Path) -> Directory:
    return Directory(tmp_path / "data")


def test_a_checkpoint_rotates_the_wal_and_retires_the_old_file_once_flushed(d):
    d.frame(1)
    fsio.pwrite(d.segments.writer(7), b"records", 0)
    d.checkpoints.dirty.add(7)
    new = d.checkpoints.start(d.wal, 1)
    assert new is not d.wal and new.number == 2
    assert d.checkpoints.dirty == set()  # the next checkpoint flushes what comes next
    d.settled()
    assert d.wal_numbers() == [2] and d.faults.failed is None


def test_the_tails_that_wait_are_in_lmdb_before_the_old_wal_goes(d):
    d.frame(1)
    tail = (walmod.PUT, DB_TAILS, id_key(1), b"t")
    d.writer.defer([tail])
    d.wal = d.checkpoints.start(d.wal, 1)
    d.settled()
    with d.meta.env.begin() as txn:
        assert txn.get(id_key(1), db=d.meta.dbs[DB_TAILS]) == b"t"
    assert d.writer.meta_lsn == 1 and d.wal_numbers() == [2]


def test_no_checkpoint_starts_while_one_runs(d):
    d.frame(1)
    with d.checkpoints._lock:  # the running checkpoint's flush cannot finish yet
        d.wal = d.checkpoints.start(d.wal, 1)
        d.frame(2)
        assert d.checkpoints.start(d.wal, 2) is d.wal  # no second rotation
    d.settled()
    assert d.wal_numbers() == [2]


def test_a_failed_flush_fails_closed_and_keeps_the_old_wal(d):
    d.frame(1)
    d.layout.segment_path(7).parent.parent.mkdir(parents=True, exist_ok=True)
    d.layout.segment_path(7).parent.write_bytes(b"")  # a file where a directory goes
    d.checkpoints.dirty.add(7)
    d.wal = d.checkpoints.start(d.wal, 1)
    d.settled()
    assert d.faults.failed is not None and "checkpoint flush failed" in d.faults.failed
    assert d.wal_numbers() == [1, 2]  # recovery replays the old file


def test_no_checkpoint_when_the_tails_that_wait_cannot_be_committed(d):
    d.frame(1)
    d.writer.defer([(walmod.PUT, DB_TAILS, id_key(1), b"t")])
    d.meta.close()  # the commit of what waits fails
    assert d.checkpoints.start(d.wal, 1) is d.wal
    assert d.faults.failed is not None and d.wal_numbers() == [1]


def test_a_clean_finish_leaves_an_empty_wal_directory(d):
    d.frame(1)
    d.checkpoints.finish(d.wal, 1)
    assert d.wal.fd == -1 and d.wal_numbers() == []


def test_a_finish_after_a_failure_closes_the_wal_and_keeps_it_for_recovery(d):
    d.frame(1)
    d.faults.fail("WAL fdatasync failed (test)")
    d.checkpoints.finish(d.wal, 1)
    assert d.wal.fd == -1 and d.wal_numbers() == [1]
    assert d.checkpoints.start_if_due(d.wal, 10**6) is d.wal  # failed: never due


def test_triggers_by_size_by_frames_and_by_age(d):
    assert not Triggers(size=1).due(d.wal, 0)  # no frame yet: nothing to checkpoint
    d.frame(5)
    assert Triggers(size=d.wal.size).due(d.wal, 5)
    assert not Triggers(size=d.wal.size + 1).due(d.wal, 5)
    assert not Triggers(frames=3).due(d.wal, 6)  # frames 5 and 6
    assert Triggers(frames=3).due(d.wal, 7)
    assert not Triggers(seconds=3600).due(d.wal, 5)
    d.wal.first_at = time.monotonic() - 10  # its first frame, ten seconds old
    assert Triggers(seconds=5).due(d.wal, 5)
