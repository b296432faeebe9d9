"""Checkpoints by frame count and by age, so that a kill -9's recovery stays short.

A checkpoint used to start only once the WAL reached 64 MiB. Recovery replays
each frame at about 0.4 ms, so a WAL of small frames (one small append a
batch) under that size held minutes of replay. It now starts after
``checkpoint_frames`` frames too, and once the WAL's oldest frame is
``checkpoint_seconds`` old; the commit pipeline looks at that age between
batches, so a WAL that no batch follows is checkpointed as well.
"""

from __future__ import annotations

from stream_format import wal as walmod
from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.pipeline import CommitPipeline
from testkit import wait_until
from testkit.engines import crash, new_stream, settled

EVERY = 5


def wal_numbers(e: Engine) -> list[int]:
    return [walmod.file_number(p) for p in walmod.wal_files(e.layout.wal)]


def test_a_checkpoint_starts_every_n_frames_and_bounds_the_replay(tmp_path):
    e = Engine(tmp_path / "d", checkpoint_frames=EVERY)
    e.open()
    new_stream(e, "a", 1)  # frame 1
    first = e.wal.number if e.wal else 0
    for n in range(2, EVERY):
        e.commit([Append(1, KIND_BYTES, [b"x"])])
        assert e.wal is not None and e.wal.number == first, n  # not yet
    e.commit([Append(1, KIND_BYTES, [b"x"])])  # frame EVERY: due
    settled(e)
    assert e.wal is not None and e.wal.number == first + 1
    assert wal_numbers(e) == [first + 1]  # the checkpointed file is gone
    for _ in range(3 * EVERY + 2):
        e.commit([Append(1, KIND_BYTES, [b"y"])])
        settled(e)
    crash(e)
    again = Engine(tmp_path / "d")
    state, report = again.open()
    assert report.wal_frames_replayed == 2  # only what followed the last checkpoint
    assert state.tails[1].unit == EVERY - 1 + 3 * EVERY + 2
    again.close()


def test_a_frame_past_the_age_is_checkpointed_and_an_empty_wal_is_not(tmp_path):
    e = Engine(tmp_path / "d", checkpoint_seconds=60.0)
    e.open()
    assert e.wal is not None
    empty = e.wal.number
    e.wal.first_at -= 3600  # an empty WAL has no age: nothing to checkpoint
    e.checkpoint_if_due()
    assert e.wal.number == empty
    new_stream(e, "a", 1)
    e.checkpoint_if_due()
    assert e.wal.number == empty  # one frame, not old yet
    e.wal.first_at -= 60
    e.checkpoint_if_due()
    settled(e)
    assert e.wal.number == empty + 1 and wal_numbers(e) == [empty + 1]
    e.close()


async def test_the_pipeline_checkpoints_an_old_frame_that_no_batch_follows(tmp_path):
    e = Engine(tmp_path / "d", checkpoint_seconds=0.05)
    e.open()
    assert e.wal is not None
    first = e.wal.number
    pipeline = CommitPipeline(e, on_failure=lambda error: None)
    pipeline.start()
    try:
        meta = StreamMeta(id=1, content_type="text/plain", created_at=0.0)
        await pipeline.submit([CreateLog(1, 0), PutStream("a", meta)])
        # No batch follows: the pipeline's own look starts the checkpoint.
        await wait_until(lambda: wal_numbers(e) == [first + 1], within=10)
    finally:
        await pipeline.stop()
        e.close()
