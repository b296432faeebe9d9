"""The frames a replica's WAL held at a crash, kept for shipping (``ReplicaHooks.replayed``):
recovery replays and then retires the WAL, and without them a restarted primary could
ship nothing older than its restart, so a standby a frame behind would re-copy
everything. Real engines on real files."""

from __future__ import annotations

from pathlib import Path

from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.replica import ReplicaHooks
from testkit.engines import crash

META = StreamMeta(id=1, content_type="application/octet-stream", created_at=0.0)


def opened(root: Path, hooks: ReplicaHooks | None) -> Engine:
    """An engine with ``hooks`` attached before recovery, as the server attaches them."""
    e = Engine(root)
    e.replica = hooks
    e.open()
    if hooks is not None:
        hooks.load(e)
    return e


def primary(hooks: ReplicaHooks, term: int) -> list[tuple[int, int, bytes]]:
    """Make ``hooks`` a writing primary at ``term``; the frames it ships, as they go."""
    hooks.writable, hooks.term = True, term
    shipped: list[tuple[int, int, bytes]] = []
    hooks.on_frame = lambda t, lsn, frame: shipped.append((t, lsn, frame))
    return shipped


def test_a_crash_leaves_the_shipped_frames_to_ship_again(tmp_path):
    hooks = ReplicaHooks()
    e = opened(tmp_path, hooks)
    shipped = primary(hooks, term=3)
    e.commit([CreateLog(1, 0), PutStream("a", META)])
    e.commit([Append(1, KIND_BYTES, [b"hello "])])
    e.commit([Append(1, KIND_BYTES, [b"world"])])
    crash(e)

    again_hooks = ReplicaHooks()
    again = opened(tmp_path, again_hooks)
    assert [lsn for _, lsn, _ in shipped] == [1, 2, 3]
    assert again_hooks.recovered == shipped  # same terms, lsns and bytes
    again.close()


def test_frames_written_before_the_replica_set_are_not_kept(tmp_path):
    """A frame without a position (single-node history) cannot be shipped: only the
    stamped frames after it are kept, so what is kept follows on without a gap."""
    e = opened(tmp_path, None)
    e.commit([CreateLog(1, 0), PutStream("a", META)])  # lsn 1, no position
    hooks = ReplicaHooks()
    hooks.load(e)
    e.replica = hooks
    shipped = primary(hooks, term=1)
    e.commit([Append(1, KIND_BYTES, [b"a"])])
    e.commit([Append(1, KIND_BYTES, [b"b"])])
    crash(e)

    again_hooks = ReplicaHooks()
    again = opened(tmp_path, again_hooks)
    assert [lsn for _, lsn, _ in again_hooks.recovered] == [2, 3]
    assert again_hooks.recovered == shipped
    again.close()
