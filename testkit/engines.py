"""An engine on real files, for tests: stopped as kill -9 would stop it, a stream created
in one batch, a range read back whole.

Shared by the engine's tests (tests/engine/) and the replication tests that
crash a standby's engine (tests/replication/).
"""

from __future__ import annotations

from pathlib import Path

from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES, KIND_JSON
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream


def settled(engine: Engine) -> None:
    """The checkpoint running on its thread, if any, finished: the next commit past the
    checkpoint size starts one of its own (one that finds a checkpoint running skips)."""
    if engine._checkpoint_thread is not None:
        engine._checkpoint_thread.join()


def crash(engine: Engine) -> None:
    """Stop an engine the way kill -9 would: no checkpoint, no final flush."""
    settled(engine)
    assert engine.wal is not None and engine.meta is not None
    engine.wal.close()
    engine.segments.close_all()
    engine.meta.close()
    engine.lock.give_back()  # as the kernel drops a killed process's (engine/dir_lock.py)


def new_stream(engine: Engine, path: str, sid: int, kind: int = KIND_BYTES, base: int = 0) -> None:
    """Create log ``sid`` and the stream ``path`` over it, in one batch."""
    ct = "application/json" if kind == KIND_JSON else "application/octet-stream"
    engine.commit(
        [
            CreateLog(sid, base),
            PutStream(path, StreamMeta(id=sid, content_type=ct, created_at=0.0, fork_offset=base)),
        ]
    )


def file_and_inline(root: Path, record: int, json: list[bytes]) -> Engine:
    """An open engine over ``root``: stream 1 (bytes, in a file) with four records of
    ``record`` bytes (``a``, ``b``, ...), one commit each; stream 2 (JSON, inline) with
    ``json``. The shape the engine's parts are tested over alone."""
    e = Engine(root, inline_max=1024)
    e.open()
    new_stream(e, "a", 1)
    for n in range(4):
        e.commit([Append(1, KIND_BYTES, [bytes([ord("a") + n]) * record])])
    new_stream(e, "j", 2, KIND_JSON)
    e.commit([Append(2, KIND_JSON, json)])
    return e


def read_all(
    engine: Engine, sid: int, kind: int, start: int, stop: int, max_bytes: int = 1 << 30
) -> bytes:
    """Log ``sid``'s bytes from ``start`` to ``stop``, read from the engine (not over HTTP:
    that is ``testkit.stream_reads.read_all``)."""
    out = b""
    cur = start
    hint = None
    while cur < stop:
        got, cur, hint = engine.read(sid, kind, cur, stop, max_bytes, hint)
        out += b"".join(got)
    return out
