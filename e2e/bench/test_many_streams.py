"""The many-streams workload's view of our checkpoints: windows seen in a ``wal/`` directory.

A checkpoint rotates the WAL (a second file) and deletes the old one when its
flush is done (server/stream_server/engine/checkpoints.py); the watch turns
that into windows. Each look is made by hand here, so nothing waits on time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.many_streams import CheckpointWatch, stalls


def wal(tmp_path: Path, number: int) -> Path:
    return tmp_path / f"{number:016d}.wal"


def test_a_window_lasts_while_the_wal_directory_holds_two_files(tmp_path):
    wal(tmp_path, 1).write_bytes(b"")
    watch = CheckpointWatch(tmp_path)
    watch.look()
    assert not watch.running and watch.windows == []
    wal(tmp_path, 2).write_bytes(b"")  # rotated: the checkpoint starts
    watch.look()
    watch.look()
    assert watch.running and watch.windows == []
    wal(tmp_path, 1).unlink()  # flushed: the old file goes
    watch.look()
    assert not watch.running
    assert len(watch.windows) == 1
    start, end = watch.windows[0]
    assert start < end
    watch.look()  # one file, the same number: nothing new
    assert len(watch.windows) == 1


def test_a_checkpoint_begun_and_done_between_two_looks_still_counts(tmp_path):
    wal(tmp_path, 1).write_bytes(b"")
    watch = CheckpointWatch(tmp_path, poll=0.01)
    watch.look()
    wal(tmp_path, 2).write_bytes(b"")
    wal(tmp_path, 1).unlink()
    watch.look()
    assert not watch.running
    [(start, end)] = watch.windows
    assert end - start == pytest.approx(0.01)


def test_a_wal_directory_not_made_yet_shows_no_checkpoint(tmp_path):
    watch = CheckpointWatch(tmp_path / "wal")
    watch.look()
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    wal(wal_dir, 1).write_bytes(b"")
    watch.look()
    assert not watch.running and watch.windows == []


def test_the_slowest_appends_are_listed_one_per_stall():
    """Appends held up together (their waits overlap) are one stall: the list shows
    the worst of each, not the same stall ten times."""
    one_stall = [(10.0, 8.1), (10.01, 8.09), (10.02, 8.08)]
    others = [(30.0, 2.5), (31.0, 0.02), (40.0, 1.2)]
    assert stalls(one_stall + others, 3) == [(10.0, 8.1), (30.0, 2.5), (40.0, 1.2)]
    assert stalls(one_stall, 10) == [(10.0, 8.1)]
