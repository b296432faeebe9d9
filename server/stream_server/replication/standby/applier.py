"""A standby's writer thread: the frames received together made durable, then
committed, off the event loop, in the order they came.

The follower waits for the first half (``write_frames``: the WAL flushed)
before it acknowledges the new position, and the second
(``commit_frames``: LMDB and the tails) runs meanwhile. Two ``to_thread``
calls per answer cost an executor work item each, its future chained to
the loop's and a worker woken for it, on every write (docs/performance.md,
"The write path's round trip, second round"); one
thread that
lives as long as the follower takes a job from a queue and hands each half's
outcome back with ``call_soon_threadsafe``.

Jobs run one at a time in order, so an answer's frames are written only
after the previous answer's commit, as ``engine/replica.py`` requires.
``stop`` lets the job under way finish: the store is closed after it.

Between the halves the thread waits, up to ``SENT_WAIT``, until the
follower has sent its acknowledgement (``Job.sent``). The commit is Python work
that holds the GIL, and the event loop, woken to send the acknowledgement,
would otherwise wait for it before it can send. The commit is not late for
it: the next answer's frames come a round trip later.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from stream_server.engine.engine import Engine
from stream_server.engine.replica import (
    Applied,
    ReplicaHooks,
    Written,
    commit_frames,
    write_frames,
)

SENT_WAIT = 0.002  # seconds the commit waits for the acknowledgement to go out (above)


class Sent:
    """Set once by the follower, waited on by the writer thread: a lock held from
    the start and released by ``set``. ``threading.Event`` does the same through
    a Python-level condition (a lock and a list of waiters per wait), once per
    commit of a standby (docs/performance.md)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # set already
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


@dataclass
class Job:
    """One answer's frames; ``written`` resolves once they are durable here (None:
    no frames), ``committed`` once their metadata is in LMDB."""

    frames: list[bytes]
    written: asyncio.Future[Written | None]
    committed: asyncio.Future[list[Applied]] = field(repr=False)
    sent: Sent = field(repr=False)


class Applier:
    def __init__(self, engine: Engine, hooks: ReplicaHooks) -> None:
        self.engine = engine
        self.hooks = hooks
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, frames: list[bytes]) -> Job:
        loop = asyncio.get_running_loop()
        if self._thread is None:
            self._loop = loop
            self._thread = threading.Thread(target=self._run, name="standby writer", daemon=True)
            self._thread.start()
        job = Job(frames, loop.create_future(), loop.create_future(), Sent())
        self._jobs.put(job)
        return job

    async def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                written = write_frames(self.engine, self.hooks, job.frames)
            except BaseException as exc:  # the engine failed closed: told to the follower
                self._hand(job.written, exc)
                assert self._loop is not None
                self._loop.call_soon_threadsafe(job.committed.cancel)  # nothing to commit
                continue
            self._hand(job.written, written)
            job.sent.wait(SENT_WAIT)
            try:
                applied = [] if written is None else commit_frames(self.engine, written)
            except BaseException as exc:
                self._hand(job.committed, exc)
                continue
            self._hand(job.committed, applied)

    def _hand(self, fut: asyncio.Future[Any], outcome: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(_settle, fut, outcome)


def _settle(fut: asyncio.Future[Any], outcome: object) -> None:
    if fut.done():  # cancelled: the follower stopped waiting (shutdown)
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)
