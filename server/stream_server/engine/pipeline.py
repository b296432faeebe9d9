"""Group commit between the event loop and the writer thread.

Operations submitted while the writer is busy with one batch form the next
batch, so under load one WAL flush and one LMDB transaction serve many
appends, and with no load a lone append goes out at once. All bookkeeping
happens on the event loop; the writer thread only runs ``Engine.commit``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable

from stream_server.engine.engine import BatchStats, Engine
from stream_server.engine.ops import Op
from stream_server.engine.replica import AckGate
from stream_server.engine.storage_errors import StorageError, StorageFailed

log = logging.getLogger("stream_server.engine")

MAX_BATCH_PAYLOAD = 32 * 1024 * 1024
# The checkpoint timer looks this often, as a share of the engine's checkpoint age: a
# frame waits at most 1.25 times that age for its checkpoint when no batch comes.
CHECKPOINT_LOOKS = 0.25

# ops, the future its submitter awaits, payload bytes, what to do on the loop once durable,
# and how many requests it carries (a worker's appends of one frame come as one entry)
Waiting = tuple[list[Op], "asyncio.Future[BatchStats]", int, Callable[[], None] | None, int]


class CommitPipeline:
    def __init__(
        self,
        engine: Engine,
        *,
        on_failure: Callable[[StorageError], None],
        on_batch: Callable[[BatchStats, int], None] | None = None,
        gate: AckGate | None = None,
    ) -> None:
        self.engine = engine
        self.on_failure = on_failure
        self.on_batch = on_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[Waiting] = []
        self._busy = False
        # Batches, the checkpoint timer's look (a callable), or None: stop.
        self._jobs: queue.SimpleQueue[list[Waiting] | Callable[[], None] | None] = (
            queue.SimpleQueue()
        )
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._closing = False  # stop() has told the writer thread to end
        # A replica set's ack gate (engine/replica.py): batches durable here wait in
        # order for the in-sync replicas before their waiters hear of them. None in
        # single-node mode.
        self.gate = gate
        # Each held batch with its lsn and the timer that answers its waiters if it is
        # held too long (cancelled once it is released, so that it keeps nothing alive).
        self._gated: list[tuple[list[Waiting], BatchStats, int, asyncio.TimerHandle]] = []
        # The lsn of the last gated batch whose changes reached the stream layer: those
        # after it that the gate refused for good are durable here but were never
        # published (the replication layer stages them when it stops being primary).
        self.published = 0
        self._releasing: asyncio.Task[None] | None = None
        # Whoever awaits ``drained``: woken once nothing is queued, written or gated.
        self._drainers: list[asyncio.Future[None]] = []

    @property
    def running(self) -> bool:
        """Whether submitted operations will be carried out (started, not stopping)."""
        return self._thread is not None and not self._closing

    @property
    def idle(self) -> bool:
        """No batch queued, being written or waiting at the gate (a replica changing
        role waits for this before another writer may touch the engine). Operations
        queue only while a batch is written, so nothing queued follows."""
        return not self._busy and not self._gated

    async def drained(self) -> None:
        """Until the pipeline is ``idle`` with nothing queued. Woken by the batch that
        leaves it so (``_wake_drainers``), not by a timer; idle may end again before
        the waiter runs, hence the loop."""
        while self._busy or self._waiting or self._gated:
            fut = asyncio.get_running_loop().create_future()
            self._drainers.append(fut)
            await fut

    def _wake_drainers(self) -> None:
        """Called (only while someone waits in ``drained``) where a batch ends."""
        if self._busy or self._waiting or self._gated:
            return
        drainers, self._drainers = self._drainers, []
        for fut in drainers:
            if not fut.done():
                fut.set_result(None)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self._thread.start()
        # Not in a replica set: a standby applies frames on a thread of its own.
        if self.engine.replica is None and math.isfinite(self.engine.triggers.seconds):
            self._look_later()

    def _look_later(self) -> None:
        assert self._loop is not None
        delay = self.engine.triggers.seconds * CHECKPOINT_LOOKS
        self._checkpoint_timer = self._loop.call_later(delay, self._look)

    def _look(self) -> None:
        """The checkpoint by age when no batch comes (a batch's commit looks itself):
        on the writer thread, between batches, as the checkpoint a batch starts."""
        if self._closing:
            return
        if not self._busy:
            self._jobs.put(self._checkpoint_if_due)
        self._look_later()

    def _checkpoint_if_due(self) -> None:
        try:
            self.engine.checkpoint_if_due()
        except Exception:  # the next look, or batch, tries again
            log.exception("could not start a checkpoint")

    async def stop(self) -> None:
        """Let in-flight batches finish, then stop the writer thread."""
        await self.drained()
        if self._checkpoint_timer is not None:
            self._checkpoint_timer.cancel()
        if self._thread is not None:
            self._closing = True  # from here a submit fails at once: nothing would run it
            self._jobs.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None

    def submit(
        self,
        ops: list[Op],
        size: int = 0,
        apply: Callable[[], None] | None = None,
        *,
        future: asyncio.Future[BatchStats] | None = None,
        requests: int = 1,
    ) -> asyncio.Future[BatchStats]:
        """Queue ops for the next batch; the future resolves once they are durable.

        ``apply`` runs on the loop when the batch has committed, before any waiter
        wakes and whether or not the submitter is still waiting (a client that
        hung up does not undo a write that became durable). ``future``: the one to
        resolve, made by a submitter that handed it out before submitting (a group
        of ``requests`` appends, ``StreamStore.append_many``).
        """
        assert self._loop is not None
        fut = self._loop.create_future() if future is None else future
        if self._closing:
            fut.set_exception(StorageFailed("the commit pipeline has stopped"))
            return fut
        self._waiting.append((ops, fut, size, apply, requests))
        if not self._busy:
            self._dispatch()
        return fut

    def _dispatch(self) -> None:
        take = 0
        payload = 0
        for _, _, size, _, _ in self._waiting:
            if take and payload + size > MAX_BATCH_PAYLOAD:
                break
            take += 1
            payload += size
        batch, self._waiting = self._waiting[:take], self._waiting[take:]
        self._busy = True
        self._jobs.put(batch)

    def _run(self) -> None:
        while True:
            batch = self._jobs.get()
            if batch is None:
                return
            if callable(batch):
                batch()
                continue
            ops = [op for group, _, _, _, _ in batch for op in group]
            started = time.perf_counter()
            try:
                stats = self.engine.commit(ops, self._more)
                result: BatchStats | BaseException = stats
            except BaseException as exc:  # reported to every waiter, never lost
                result = exc
            elapsed = time.perf_counter() - started
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._done, batch, result, elapsed)

    def _more(self) -> bool:
        """Whether a batch waits behind the one being written: read on the writer
        thread, where a list's truth is safe to read; one that waits is dispatched once
        this one is done, and its LMDB transaction takes this one's tails."""
        return bool(self._waiting)

    def _done(
        self, batch: list[Waiting], result: BatchStats | BaseException, elapsed: float
    ) -> None:
        self._busy = False
        if isinstance(result, BaseException):
            self._failed(batch, result)
            return
        if self.on_batch is not None:
            self.on_batch(result, sum(w[4] for w in batch))
        if self.gate is not None:
            self._hold(batch, result, self.gate)
            return
        self._resolve(batch, result)
        if self._waiting:
            self._dispatch()
        elif self._drainers:
            self._wake_drainers()

    def _failed(self, batch: list[Waiting], result: BaseException) -> None:
        """Everything queued since the failed batch was validated against state that
        now never happened: fail it too, then let the stream layer roll back."""
        failed = batch + self._waiting
        self._waiting = []
        error = result if isinstance(result, StorageError) else StorageError(str(result))
        for _, fut, _, _, _ in failed:
            if not fut.done():
                fut.set_exception(error)
        self.on_failure(error)
        if self._drainers:
            self._wake_drainers()

    def _hold(self, batch: list[Waiting], result: BatchStats, gate: AckGate) -> None:
        """A durable batch of a replica set waits at the gate, with a deadline of its own
        from when it got there: one queued behind a held batch must not wait for that
        batch's release to start counting (the gate releases in lsn order, and may hold
        the first long)."""
        assert self._loop is not None
        timer = self._loop.call_later(gate.wait_seconds, self._overdue, batch)
        self._gated.append((batch, result, self.engine.lsn, timer))
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.ensure_future(self._release())
        if self._waiting:
            self._dispatch()  # the next batch is written while this one ships

    def _overdue(self, batch: list[Waiting]) -> None:
        """The batch's waiters have waited ``gate.wait_seconds``: they hear 503 (an
        unknown outcome); the batch itself stays gated and is published once
        replicated."""
        if self.gate is None or not any(b is batch for b, _, _, _ in self._gated):
            return
        error = self.gate.overdue()
        for _, fut, _, _, _ in batch:
            if not fut.done():
                fut.set_exception(error)

    def _resolve(self, batch: list[Waiting], result: BatchStats) -> None:
        for _, _, _, apply, _ in batch:
            if apply is not None:
                apply()
        for _, fut, _, _, _ in batch:
            if not fut.done():
                fut.set_result(result)

    async def _release(self) -> None:
        """Resolve gated batches in lsn order, each once the gate lets it through.

        A batch the gate holds past its wait has failed its waiters (``_overdue``:
        503, they may retry) but is still published once replicated, as later
        batches build on it; one
        the gate refuses for good (this replica was deposed) fails and is not
        published: the replication layer reloads the stream state then.
        """
        assert self.gate is not None
        while self._gated:
            batch, result, lsn, timer = self._gated[0]

            def late(error: StorageError, batch: list[Waiting] = batch) -> None:
                for _, fut, _, _, _ in batch:
                    if not fut.done():
                        fut.set_exception(error)

            try:
                passed = await self.gate.wait(lsn, late)
            except Exception as exc:  # a broken gate must not strand the waiters
                late(StorageError(f"replication failed: {exc!r}"))
                passed = False
            self._gated.pop(0)
            timer.cancel()
            if passed:
                self._resolve(batch, result)
                self.published = lsn
            if self._drainers:
                self._wake_drainers()
