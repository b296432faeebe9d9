"""Expiry: TTLs, Expires-At, and the sweeper that deletes what has passed either.

A stream's lifetime comes from the create request, else from its fork source,
else from the server's default TTL; which one is recorded (``expiry_from``) so
that a repeated create without expiry headers still matches. A read renews a
TTL: the clock moves in memory at once and reaches disk with the next write
or the next sweep (``flush_touched``), so a restart does not expire a stream
early. Expired streams are deleted in the background, found either when a
request touches them or by the sweeper, which visits only streams that have
a lifetime at all (``timed``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import NamedTuple

from stream_format.meta import StreamMeta
from stream_server.engine import BatchStats
from stream_server.engine.ops import Op, PutStream
from stream_server.streams.clock import WALL_CLOCK, Clock
from stream_server.streams.errors import StreamError
from stream_server.streams.model import Stream
from stream_server.streams.pending import StreamTable
from stream_server.streams.requests import CreateRequest

log = logging.getLogger("stream_server.streams")

Commit = Callable[[list[Op], int, Callable[[], None]], Awaitable[BatchStats]]
QueueDelete = Callable[[Stream, str], tuple[list[Op], Callable[[], None]]]


class Lifetime(NamedTuple):
    ttl: int | None
    expires_at: str | None
    expires_at_ts: float | None
    expiry_from: str  # "request" | "source" | "default"


def lifetime(req: CreateRequest, source: StreamMeta | None, default_ttl: int | None) -> Lifetime:
    """The lifetime a new stream gets: asked for, inherited from its fork source, or default."""
    ttl, expires_at, expires_at_ts = req.ttl, req.expires_at, req.expires_at_ts
    expiry_from = "request"
    if source is not None and ttl is None and expires_at is None:
        ttl = source.ttl
        expires_at, expires_at_ts = source.expires_at, source.expires_at_ts
        expiry_from = "source"
    if ttl is None and expires_at is None and default_ttl:
        ttl = default_ttl
        expiry_from = "default"
    return Lifetime(ttl, expires_at, expires_at_ts, expiry_from)


def same_lifetime(req: CreateRequest, m: StreamMeta) -> bool:
    """Whether a repeated create asks for the lifetime the existing stream ``m`` has."""
    if (
        req.ttl is None
        and req.expires_at is None
        and m.extra.get("expiry_from")
        in (
            "source",
            "default",
        )
    ):
        return True  # the expiry was not asked for the first time either
    return (req.ttl, req.expires_at_ts) == (m.ttl, m.expires_at_ts)


class Expiry:
    """Which streams can expire, whose TTL clock moved, and which are being deleted."""

    def __init__(
        self,
        table: StreamTable,
        *,
        interval: float,
        commit: Commit,
        queue_delete: QueueDelete,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        self._table = table
        self._clock = clock
        self._interval = interval
        self._commit = commit
        self._queue_delete = queue_delete
        self.timed: set[str] = set()  # streams with a TTL or Expires-At: the sweeper's list
        self.touched: set[str] = set()  # TTL clocks renewed in memory, not yet on disk
        self.expiring: set[str] = set()  # expiry deletes queued, not yet durable
        self._deletes: set[asyncio.Task[None]] = set()  # their tasks
        self._sweeper: asyncio.Task[None] | None = None
        # A standby of a replica set: the primary deletes what expires, and its
        # deletions reach this replica as replicated frames.
        self.paused = False

    def track(self, s: Stream) -> None:
        if s.meta.ttl is not None or s.meta.expires_at_ts is not None:
            self.timed.add(s.path)

    def touch(self, s: Stream, now: float) -> None:
        s.meta.touched_at = s.pending.meta.touched_at = now
        if s.meta.ttl is not None and not self.paused:
            self.touched.add(s.path)

    def written(self, s: Stream) -> None:
        """A queued write of ``s``'s configuration carries its TTL clock to disk."""
        self.touched.discard(s.path)

    def expire(self, s: Stream) -> None:
        """Delete an expired stream in the background (soft if forks need it)."""
        if self.paused or s.path in self.expiring or s.pending.meta.soft_deleted:
            return
        self.expiring.add(s.path)
        ops, apply = self._queue_delete(s, "expired")

        async def run() -> None:
            try:
                await self._commit(ops, 0, apply)
            except StreamError as exc:
                log.warning("could not expire stream %s: %s", s.path, exc)
            finally:
                self.expiring.discard(s.path)

        task = asyncio.get_running_loop().create_task(run())
        self._deletes.add(task)  # held: the loop keeps only a weak reference to a task
        task.add_done_callback(self._deletes.discard)

    async def drained(self) -> None:
        """Return once every expiry delete queued so far is durable (or failed)."""
        if self._deletes:
            await asyncio.gather(*self._deletes)

    def sweep(self) -> int:
        """Expire every stream whose TTL or Expires-At has passed."""
        now = self._clock()
        expired = []
        for path in list(self.timed):
            s = self._table.get(path)
            if s is None:
                self.timed.discard(path)
            elif s.committed and not s.pending.meta.soft_deleted and s.expired(now):
                expired.append(s)
        for s in expired:
            self.expire(s)
        return len(expired)

    async def flush_touched(self) -> None:
        """Persist read-renewed TTL clocks, so a restart does not expire them early."""
        if self.paused:
            self.touched.clear()
        if not self.touched:
            return
        ops: list[Op] = []
        for path in self.touched:
            s = self._table.get(path)
            if s is not None and s.committed:
                ops.append(PutStream(path, replace(s.pending.meta)))
        self.touched.clear()
        if ops:
            await self._commit(ops, 0, lambda: None)

    def start(self) -> None:
        if self.paused or self._sweeper is not None:
            return
        self._sweeper = asyncio.create_task(self._sweep_forever())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def pause(self) -> None:
        """Stop deleting and sweeping (a standby): its batches would be refused."""
        self.paused = True
        self.stop()
        self.touched.clear()

    def resume(self) -> None:
        """Sweep again (promoted to primary): what expired meanwhile goes first."""
        self.paused = False
        self.start()

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                self.sweep()
                await self.flush_touched()
            except StreamError as exc:
                log.warning("sweep: %s", exc)
            except Exception:
                log.exception("sweep failed")
