"""The engine's public frame path (``Engine.append_frames``, ``Engine.commit_frames``):
frames one engine's ``commit`` made, applied to another, leave it in the state the
first is in, through the same publish step (tails, dropped files, punched heads).
Real engines on real files; the frames are caught by a ``ReplicaRole`` of the test's
own, which is all the engine knows of a replica set."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_format import wal
from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.batch import Batch
from stream_server.engine.ops import (
    Append,
    CreateLog,
    DeleteStream,
    DropHead,
    DropLog,
    Op,
    PutProducer,
    PutStream,
)
from stream_server.engine.storage_errors import StorageFailed


class Catch:
    """A ``ReplicaRole`` that keeps each batch's frame, as a primary's shipper would."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.term = 1

    def check_writable(self) -> None:
        pass

    def stamp(self, batch: Batch, lsn: int) -> None:
        pass

    def committed(self, lsn: int, frame: bytes) -> None:
        self.frames.append(frame)

    def replayed(self, lsn: int, changes: list[wal.Entry], frame: memoryview) -> None:
        pass


def meta(sid: int) -> StreamMeta:
    return StreamMeta(id=sid, content_type="application/octet-stream", created_at=0.0)


def primary(root: Path, batches: list[list[Op]]) -> tuple[Engine, list[bytes]]:
    catch = Catch()
    e = Engine(root, replica=catch)
    e.open()
    for ops in batches:
        e.commit(ops)
    return e, catch.frames


def opened(root: Path) -> Engine:
    e = Engine(root)
    e.open()
    return e


def read_all(e: Engine, sid: int) -> bytes:
    tail = e.tails[sid]
    got, _, _ = e.read(sid, KIND_BYTES, tail.start, tail.unit, 1 << 20, None)
    return b"".join(got)


def test_applied_frames_publish_what_the_primary_published(tmp_path: Path) -> None:
    big = b"x" * 5000
    first, frames = primary(
        tmp_path / "p",
        [
            [CreateLog(1, 0), PutStream("a", meta(1)), CreateLog(2, 0), PutStream("b", meta(2))],
            [Append(1, KIND_BYTES, [big, b"kept"]), Append(2, KIND_BYTES, [b"gone"])],
            [PutProducer(1, "writer", 0, 3)],
        ],
    )
    # Retention moves stream 1's start past the big record; stream 2 is deleted.
    point = first.retention_point(1, min_pos=5000, cutoff_us=None, max_unit=first.tails[1].unit)
    assert point is not None
    first.commit([DropHead(1, *point), DeleteStream("b"), DropLog(2)])
    # ``frames`` is the catcher's list: it has the last batch's frame too.
    standby = opened(tmp_path / "s")

    appended = standby.append_frames(frames)
    assert appended is not None
    assert [lsn for lsn, _ in appended.frames] == [1, 2, 3, 4]
    assert standby.lsn == 4 and not standby.tails  # durable, not yet published
    standby.commit_frames(appended)

    assert standby.tails == first.tails  # stream 1 only, its start moved
    assert standby.tails[1].start == point[0]
    assert not standby.segments.path(2).exists() and not first.segments.path(2).exists()
    assert read_all(standby, 1) == read_all(first, 1) == b"kept"
    assert standby.reclaimed_bytes == first.reclaimed_bytes
    first.close()
    standby.close()


def test_frames_applied_in_several_groups_end_as_one(tmp_path: Path) -> None:
    """A standby applies each fetch answer as a group; where the answers split the
    frames does not change the outcome."""
    first, frames = primary(
        tmp_path / "p",
        [
            [CreateLog(1, 0), PutStream("a", meta(1))],
            [Append(1, KIND_BYTES, [b"one "])],
            [Append(1, KIND_BYTES, [b"two "])],
            [Append(1, KIND_BYTES, [b"three"])],
        ],
    )
    standby = opened(tmp_path / "s")
    for group in (frames[:1], frames[1:3], frames[3:]):
        appended = standby.append_frames(group)
        assert appended is not None
        standby.commit_frames(appended)
    assert standby.tails == first.tails
    assert read_all(standby, 1) == b"one two three"
    first.close()
    standby.close()


def test_a_damaged_frame_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    first, frames = primary(
        tmp_path / "p",
        [[CreateLog(1, 0), PutStream("a", meta(1))], [Append(1, KIND_BYTES, [b"data"])]],
    )
    damaged = bytearray(frames[1])
    damaged[-1] ^= 0xFF
    standby = opened(tmp_path / "s")
    wal_size = standby.wal.size if standby.wal is not None else -1
    with pytest.raises(ValueError, match="damaged"):
        standby.append_frames([frames[0], bytes(damaged)])
    assert standby.wal is not None and standby.wal.size == wal_size
    assert standby.lsn == 0 and not standby.failed
    assert standby.append_frames([]) is None
    first.close()
    standby.close()


def test_an_engine_failed_closed_applies_no_frames(tmp_path: Path) -> None:
    first, frames = primary(tmp_path / "p", [[CreateLog(1, 0), PutStream("a", meta(1))]])
    standby = opened(tmp_path / "s")

    def fail(stage: str) -> None:
        if stage == "fsync":
            raise OSError("disk gone (test)")

    standby.faults.fault_hook = fail
    with pytest.raises(StorageFailed):  # the flush of our own batch fails: closed
        standby.commit([CreateLog(9, 0)])
    with pytest.raises(StorageFailed):
        standby.append_frames(frames)
    first.close()
    standby.close()


def test_write_metadata_flushed_survives_a_reopen(tmp_path: Path) -> None:
    e = opened(tmp_path / "d")
    e.write_metadata([(wal.PUT, 0, b"test_key", b"value")], flush=True)
    assert e.meta is not None
    with e.meta.env.begin() as txn:
        assert txn.get(b"test_key", db=e.meta.dbs[0]) == b"value"
    e.close()
    again = opened(tmp_path / "d")
    assert again.meta is not None
    with again.meta.env.begin() as txn:
        assert txn.get(b"test_key", db=again.meta.dbs[0]) == b"value"
    again.close()
