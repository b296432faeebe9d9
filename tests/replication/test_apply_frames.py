"""A standby's apply in two halves (``engine/replica.py``): ``write_frames`` makes the
primary's frames durable (WAL flushed) and moves the durable position the standby
reports; ``commit_frames`` writes LMDB afterwards. A crash between the two loses
nothing the standby reported: recovery replays the frames. Real engines on real files."""

from __future__ import annotations

import lmdb
import pytest

from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.replica import ReplicaHooks, commit_frames, write_frames
from stream_server.engine.storage_errors import StorageFailed
from testkit.engines import crash
from testkit.replica_engines import primary_frames, standby


def test_frames_written_but_not_committed_survive_a_crash(tmp_path):
    frames = primary_frames(tmp_path / "primary")
    e, hooks = standby(tmp_path / "standby")
    written = write_frames(e, hooks, frames)
    assert written is not None
    # What the standby reports from here on: durable, though LMDB has none of it yet.
    assert hooks.durable == (2, 3)
    assert not e.tails  # the engine's tails move with the LMDB commit only
    crash(e)

    again, hooks2 = standby(tmp_path / "standby")
    assert hooks2.durable == (2, 3)  # replayed from the WAL
    assert again.lsn == 3
    assert again.tails[1].unit == len(b"hello world")
    got, _, _ = again.read(1, KIND_BYTES, 0, len(b"hello world"), 1 << 20, None)
    assert b"".join(got) == b"hello world"
    again.close()


def test_commit_frames_publishes_what_write_frames_made_durable(tmp_path):
    frames = primary_frames(tmp_path / "primary")
    e, hooks = standby(tmp_path / "standby")
    written = write_frames(e, hooks, frames)
    assert written is not None
    applied = commit_frames(e, written)
    assert [(lsn, position) for lsn, position, _ in applied] == [
        (1, (2, 1)),
        (2, (2, 2)),
        (3, (2, 3)),
    ]
    assert e.tails[1].unit == len(b"hello world")
    assert hooks.terms == [(2, 1)]
    e.close()
    again, hooks2 = standby(tmp_path / "standby")
    assert hooks2.durable == (2, 3)
    again.close()


def test_a_primary_ships_once_flushed_and_fails_closed_when_lmdb_then_fails(tmp_path):
    """The frame goes to the standbys before the primary's LMDB commit; if that commit
    fails, the frame is not taken back (a standby may hold it): the primary fails
    closed, and its restart replays the frame from the WAL."""
    shipped_at_commit: list[int] = []
    frames: list[bytes] = []

    def hook(stage: str) -> None:
        if stage == "wal":  # flushed, LMDB not committed yet
            shipped_at_commit.append(len(frames))
            if len(frames) == 2:
                raise lmdb.Error("injected LMDB failure")

    e = Engine(tmp_path / "d", fault_hook=hook)
    e.open()
    hooks = ReplicaHooks()
    hooks.load(e)
    hooks.writable, hooks.term = True, 1
    hooks.on_frame = lambda term, lsn, frame: frames.append(frame)
    e.replica = hooks
    meta = StreamMeta(id=1, content_type="application/octet-stream", created_at=0.0)
    e.commit([CreateLog(1, 0), PutStream("a", meta)])
    with pytest.raises(StorageFailed):
        e.commit([Append(1, KIND_BYTES, [b"shipped"])])
    assert shipped_at_commit == [1, 2]  # each frame was out before its LMDB commit
    assert e.failed
    with pytest.raises(StorageFailed):
        e.commit([Append(1, KIND_BYTES, [b"refused"])])
    crash(e)
    again, hooks2 = standby(tmp_path / "d")
    assert hooks2.durable == (1, 2)
    got, _, _ = again.read(1, KIND_BYTES, 0, len(b"shipped"), 1 << 20, None)
    assert b"".join(got) == b"shipped"
    again.close()
