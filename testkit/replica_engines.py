"""A primary's shipped frames and a standby's engine, on real files: what the tests of a
standby's apply start from.

Shared by tests/replication/test_apply_frames.py (the two halves of an apply)
and test_applier.py (the applier over them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.replica import ReplicaHooks


def primary_frames(root: Path, batches: Callable[[Engine], None] | None = None) -> list[bytes]:
    """The frames of a primary at term 2, as shipped: ``batches`` commits them (by
    default three: a stream created, two appends)."""
    e = Engine(root)
    e.open()
    hooks = ReplicaHooks()
    hooks.load(e)
    hooks.writable, hooks.term = True, 2
    frames: list[bytes] = []
    hooks.on_frame = lambda term, lsn, frame: frames.append(frame)
    e.replica = hooks
    (batches or _three_batches)(e)
    e.close()
    return frames


def _three_batches(e: Engine) -> None:
    meta = StreamMeta(id=1, content_type="application/octet-stream", created_at=0.0)
    e.commit([CreateLog(1, 0), PutStream("a", meta)])
    e.commit([Append(1, KIND_BYTES, [b"hello "])])
    e.commit([Append(1, KIND_BYTES, [b"world"])])


def standby(root: Path) -> tuple[Engine, ReplicaHooks]:
    """An engine opened with replica hooks and not writable: a standby's, to apply to."""
    e = Engine(root)
    e.open()
    hooks = ReplicaHooks()
    hooks.load(e)
    e.replica = hooks
    return e, hooks
