"""The commit pipeline's ack gate on a real engine: each held batch's waiters get
their answer ``wait_seconds`` after *their* batch reached the gate, whatever is
held before it (a write queued behind a held batch once waited 16.6 s)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable

from stream_format.meta import StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.pipeline import CommitPipeline
from stream_server.engine.replica import NotReplicated
from stream_server.engine.storage_errors import StorageError


class HoldingGate:
    """A gate that lets batches through only up to ``released`` (a standby that
    stopped acknowledging, then came back)."""

    def __init__(self, wait_seconds: float) -> None:
        self.wait_seconds = wait_seconds
        self.released = 0
        self.changed = asyncio.Event()

    async def wait(self, lsn: int, late: Callable[[StorageError], None]) -> bool:
        while self.released < lsn:
            await self.changed.wait()
            self.changed.clear()
        return True

    def overdue(self) -> StorageError:
        return NotReplicated("not acknowledged in time; retry")

    def release(self, lsn: int) -> None:
        self.released = lsn
        self.changed.set()


async def test_a_batch_queued_behind_a_held_one_times_out_on_its_own_deadline(tmp_path):
    engine = Engine(tmp_path / "d")
    await asyncio.to_thread(engine.open)
    pipeline = CommitPipeline(engine, on_failure=lambda e: None)
    gate = HoldingGate(wait_seconds=0.3)
    pipeline.gate = gate
    pipeline.start()
    loop = asyncio.get_running_loop()
    try:
        meta = StreamMeta(id=1, content_type="text/plain", created_at=0.0)
        setup = pipeline.submit([CreateLog(1, 0), PutStream("s", meta)])
        gate.release(engine.lsn + 1)
        await setup
        held = asyncio.Event()
        pipeline.on_batch = lambda stats, n: held.set()
        first = pipeline.submit([Append(1, KIND_BYTES, [b"a"])])
        await held.wait()  # the first batch is durable and held at the gate
        # The second batch reaches the gate well after the first, so its deadline is
        # later; the gate never lets the first through before both are overdue.
        await asyncio.sleep(0.2)
        second_sent = loop.time()
        second = pipeline.submit([Append(1, KIND_BYTES, [b"b"])])
        # Under the old code the second batch's wait began only once the first was
        # released, which the gate never does here: this timed out.
        both = asyncio.gather(first, second, return_exceptions=True)
        results = await asyncio.wait_for(both, timeout=30)
        answered = loop.time()
        assert all(isinstance(r, NotReplicated) for r in results), results
        # Both answered while the first batch was still held, the second not before
        # its own deadline.
        assert len(pipeline._gated) == 2
        assert answered - second_sent >= gate.wait_seconds - 0.05
        # Both are still published once replicated: later batches build on them.
        gate.release(engine.lsn)
        await pipeline.drained()
        assert engine.tails[1].unit == 2
    finally:
        gate.release(1 << 62)
        await pipeline.stop()
        engine.close()


async def test_a_released_batch_is_kept_alive_by_nothing(tmp_path):
    """Its overdue timer is cancelled on release: a timer left to run would keep every
    batch of the last ``wait_seconds`` alive (ops, payloads, futures), which under
    load costs the garbage collector more per append."""
    engine = Engine(tmp_path / "d")
    await asyncio.to_thread(engine.open)
    pipeline = CommitPipeline(engine, on_failure=lambda e: None)
    gate = HoldingGate(wait_seconds=60.0)
    gate.release(1 << 62)
    pipeline.gate = gate
    pipeline.start()
    try:
        meta = StreamMeta(id=1, content_type="text/plain", created_at=0.0)
        fut = pipeline.submit([CreateLog(1, 0), PutStream("s", meta)])
        await fut
        ref = weakref.ref(fut)
        del fut
        # The next batch, so that the writer thread no longer holds the first.
        await pipeline.submit([Append(1, KIND_BYTES, [b"a"])])
        await pipeline.drained()
        gc.collect()
        assert ref() is None
    finally:
        await pipeline.stop()
        engine.close()


async def test_drained_returns_once_no_batch_is_written_or_held(tmp_path):
    """``CommitPipeline.drained`` (what a role switch and a switchover await) ends
    when the last held batch passes the gate, woken by it, not by a timer."""
    engine = Engine(tmp_path / "d")
    await asyncio.to_thread(engine.open)
    pipeline = CommitPipeline(engine, on_failure=lambda e: None)
    gate = HoldingGate(wait_seconds=60.0)
    pipeline.gate = gate
    pipeline.start()
    try:
        await pipeline.drained()  # nothing submitted: at once
        meta = StreamMeta(id=1, content_type="text/plain", created_at=0.0)
        held = pipeline.submit([CreateLog(1, 0), PutStream("s", meta)])
        drained = asyncio.ensure_future(pipeline.drained())
        batch_seen = asyncio.Event()
        pipeline.on_batch = lambda stats, n: batch_seen.set()
        await batch_seen.wait()  # durable, now held at the gate
        assert not pipeline.idle and not drained.done()
        gate.release(engine.lsn)
        await held
        await drained
        assert pipeline.idle
    finally:
        await pipeline.stop()
        engine.close()
