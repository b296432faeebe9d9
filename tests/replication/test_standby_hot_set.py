"""A standby's stream layer keeps the same hot set as a primary's: frames publish into
loaded streams, and the mirror's index by id keeps no dropped stream alive (it held
every stream a frame ever named). Real engines on real files, in process."""

from __future__ import annotations

import gc

from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.declared.network import LimitsSettings
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.replica import ReplicaHooks, commit_frames, write_frames
from stream_server.replication.standby.mirror import Mirror
from stream_server.streams.replicated import ReplicatedStreams
from stream_server.streams.store import StreamStore
from testkit.replica_engines import primary_frames

STREAMS = 40
HOT = 16


def forty_streams(e: Engine) -> None:
    for sid in range(1, STREAMS + 1):
        meta = StreamMeta(id=sid, content_type="application/octet-stream", created_at=0.0)
        e.commit([CreateLog(sid, 0), PutStream(f"s/{sid}", meta)])
        e.commit([Append(sid, KIND_BYTES, [b"%d;" % sid])])


async def test_frames_for_many_streams_leave_a_bounded_hot_set_that_reads_right(tmp_path):
    frames = primary_frames(tmp_path / "primary", forty_streams)
    engine = Engine(tmp_path / "standby")
    store = StreamStore(
        tmp_path / "standby", engine=engine, settings=LimitsSettings(hot_streams=HOT)
    )
    await store.start()
    hooks = ReplicaHooks()
    hooks.load(engine)
    engine.replica = hooks
    mirror = Mirror(ReplicatedStreams(store), lambda: engine.lsn)
    try:
        for i in range(0, len(frames), 4):
            written = write_frames(engine, hooks, frames[i : i + 4])
            assert written is not None
            for lsn, _, changes in commit_frames(engine, written):
                mirror.stage(lsn, changes)
            mirror.publish(engine.lsn)
        gc.collect()
        assert len(store.table.by_path) <= HOT + 2
        assert len(mirror._by_id) <= HOT + 2  # weak: it holds what the table holds
        for sid in (1, 20, STREAMS):  # dropped ones come back from LMDB, as committed
            s = store.get(f"s/{sid}")
            r = await store.read(s, 0, 100)
            assert b"".join(r.payloads) == b"%d;" % sid
    finally:
        await store.stop()
