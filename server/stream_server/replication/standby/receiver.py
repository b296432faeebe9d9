"""A standby's follow-and-apply loop (PostgreSQL's walreceiver).

While this replica is a standby of a known primary, it asks the primary for the
frames after its durable position over a stream (``sender.py``). It writes the
frames it received through the engine's commit path (one flush for all of
them), and makes the ones at or below the announced commit point visible to
its readers (``mirror``). It then reports its new position (the stream's
``ACK``): that is its acknowledgement. It is sent once the frames are
durable (``engine.replica.write_frames``: segments, WAL, fdatasync), while
their LMDB commit (``commit_frames``) runs, both on the standby's writer
thread (``applier.py``); ``applying`` keeps the next frames, a
promotion and a re-copy behind that commit.

This replica's read freshness (``freshness.py``) is renewed only by the
stream's echo: each acknowledgement carries a stamp of its clock, which the
primary echoes only while it vouches for its commit point and has settled
what it took over (``Shipper.echoing``). The acknowledgements go in answer to
every message, the heartbeats included, so an idle stream renews freshness
once a heartbeat. A primary that refuses our stream version (426) is of
another version than ours: a rolling update must update the standbys first
(docs/compatibility.md), so this replica says so (``problem``) and asks again.

A stream from a term older than the highest term seen is
refused: it comes from a deposed primary. A 409 says why the primary will not serve us (wrong
term: the role loop will catch up; diverged or too far behind: this replica
must be re-copied, shown in ``/replication`` as ``problem``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from stream_server.engine.engine import Engine
from stream_server.engine.replica import ReplicaHooks
from stream_server.replication import rules
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.peers import wire
from stream_server.replication.peers.peer_http import (
    READ_SIZE,
    PeerError,
    PeerResponse,
    PeerStream,
    TlsContext,
    open_stream,
    system_tls,
)
from stream_server.replication.primary.shipping import Shipper
from stream_server.replication.standby.applier import Applier, Job
from stream_server.replication.standby.freshness import Freshness
from stream_server.replication.standby.mirror import Mirror

log = logging.getLogger("stream_server.replication")

RECOPY = ("diverged", "too far behind: re-copy")
T = TypeVar("T")

# Seconds: a stream's request is answered, and a message comes, within a second
# when the primary is alive.
STREAM_TIMEOUT = 15.0


class Follower:
    def __init__(
        self,
        roles: RoleLoop,
        engine: Engine,
        hooks: ReplicaHooks,
        shipper: Shipper,
        mirror: Mirror,
        *,
        retry_period: float,
        freshness: Freshness | None = None,
        recopy: Callable[[str], Awaitable[None]] | None = None,
        join: Callable[[], Awaitable[str | None]] | None = None,
        set_id: Callable[[], str] = str,
        auth: Callable[[], dict[str, str]] = dict,
        tls: TlsContext = system_tls,
    ) -> None:
        self.roles = roles
        self.engine = engine
        self.hooks = hooks
        self.shipper = shipper
        self.mirror = mirror
        self.retry_period = retry_period
        self.freshness = freshness if freshness is not None else Freshness(5.0)
        self.applier = Applier(engine, hooks)
        self.following = False  # set by the service once the engine is in standby mode
        self.applying = asyncio.Lock()  # held while frames are being written
        self.highest_term = 0
        self.commit = 0  # the primary's last announced commit point
        self.received: rules.Position = (0, 0)  # the last frame received (maybe not durable)
        self.problem: str | None = None
        self.heard_at = 0.0  # our clock at the last message (lag in seconds)
        self._watching: asyncio.TimerHandle | None = None  # a stream's watchdog (_watch)
        self._task: asyncio.Task[None] | None = None
        self._finishing: asyncio.Task[None] | None = None  # the last answer's LMDB commit
        # The peer token's header (``peer_token.py``), sent on every request; none without.
        self.auth = auth
        # The client context for an https primary (``peer_tls.py``), at each connection.
        self.tls = tls
        # Called when the primary says we cannot follow by frames (diverged, or too
        # far behind): the service re-copies this replica from the primary.
        self.on_recopy = recopy
        # Before following: why this data directory may not join the Lease's set
        # (``identity.py``; it adopts the set's id when it has none), or None.
        self.join = join
        self.set_id = set_id  # sent with every request: the set we hold

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="replication follower")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._finishing is not None:
            await self._finishing  # never cancelled: the store closes after it
        await self.applier.stop()  # the job under way ends first

    async def _run(self) -> None:
        while True:
            state = self.roles.state
            if not self.following or self.roles.is_primary or not state.primary_url:
                await self._news()
                continue
            if self.join is not None and await self.join() is not None:
                await self._news()  # another set's data, or single-node data: never
                continue
            try:
                await self._stream(state.primary_url, state.term)
            except (PeerError, ValueError) as exc:
                self.problem = f"following {state.primary_url} failed: {exc!r}"
                await asyncio.sleep(self.retry_period)
            except Exception:
                log.exception("follower round failed")
                await asyncio.sleep(self.retry_period)

    def _acknowledged(self) -> rules.Position:
        """The position our next acknowledgement names (``rules.acknowledged``)."""
        return rules.acknowledged(self.hooks.durable, max(self.received, self.hooks.durable))

    def _params(self, term: int) -> dict[str, str | int]:
        after_term, after_lsn = self._acknowledged()
        return {
            "name": self.roles.config.name,
            "term": term,
            "after_term": after_term,
            "after_lsn": after_lsn,
            "committed": self.commit,
            "url": self.roles.config.url,  # what a switchover names as the new primary
            "set": self.set_id(),  # the primary refuses another set's follower
        }

    async def _stream(self, primary: str, term: int) -> None:
        """Follow ``primary`` over one stream (``sender.py``) until it ends, the
        term or the primary changes, or we stop following."""
        r = await self._open(primary, term)
        if r is None:
            return
        loop = asyncio.get_running_loop()
        self.heard_at = loop.time()
        self._watching = loop.call_later(self.retry_period, self._watch, r.writer, primary, term)
        try:
            if not self._answer_term(int(r.headers[wire.TERM]), term):
                await self._news()
                return
            # A stamp at once: the primary's first message echoes it.
            r.writer.write(wire.ack(*self._acknowledged(), self.commit, self.freshness.stamp()))
            buffer = bytearray(r.early)
            while True:
                try:
                    frames, commit, echo = await _messages(r.reader, buffer)
                except PeerError:
                    if self._stale(primary, term):
                        return  # ended by _watch: we follow someone else now, or no one
                    raise
                self.heard_at = loop.time()
                self.problem = None
                job = await self._apply(self._in_order(frames), commit)
                self.freshness.heard(echo, commit, self.mirror.published)
                r.writer.write(wire.ack(*self._acknowledged(), self.commit, self.freshness.stamp()))
                if job is not None:
                    job.sent.set()
                if self._stale(primary, term):
                    return
        finally:
            if self._watching is not None:
                self._watching.cancel()
            r.writer.close()

    async def _open(self, primary: str, term: int) -> PeerStream | None:
        """The stream from ``primary``; None when it refused (handled here), and once the
        Lease names another primary or term: a primary cut off from us (its packets
        dropped) would otherwise hold us for STREAM_TIMEOUT, while a new primary waits
        for us to join it, and may give the Lease up for want of us."""
        r = await unless_stale(
            open_stream(
                f"{primary}{wire.STREAM_PATH}",
                self._params(term),
                self.auth(),
                wire.UPGRADE,
                within=STREAM_TIMEOUT,
                tls=self.tls,
            ),
            lambda: self._stale(primary, term),
            self.retry_period,
        )
        if not isinstance(r, PeerResponse):
            return r
        if r.status == 426:
            await self._other_version(r, primary)
        else:
            await self._refused(r, primary, term)
        return None

    async def _other_version(self, r: PeerResponse, primary: str) -> None:
        """The primary speaks none of our stream versions: a primary updated before
        its standbys, or one left of a release that no longer bridges to ours. Said
        in ``problem`` and the log (once), and asked again each retry period: the
        rollout that updates this replica, or the primary, ends it."""
        offered = r.headers.get("upgrade") or "no stream version"
        reason = (
            f"the primary at {primary} speaks {offered}, not {wire.UPGRADE}: "
            "update the standbys first (docs/compatibility.md)"
        )
        if self.problem != reason:
            log.warning("%s", reason)
        self.problem = reason
        await self._news()

    def _stale(self, primary: str, term: int) -> bool:
        """Whether a stream from ``primary`` in ``term`` is no longer ours to follow."""
        state = self.roles.state
        return not self.following or state.term != term or state.primary_url != primary

    def _watch(self, writer: asyncio.StreamWriter, primary: str, term: int) -> None:
        """End a stream that is no longer ours to follow, or whose primary fell
        silent (it sends at least every second); else look again later."""
        loop = asyncio.get_running_loop()
        if self._stale(primary, term) or loop.time() - self.heard_at > STREAM_TIMEOUT:
            writer.close()  # the read under way ends
            return
        self._watching = loop.call_later(self.retry_period, self._watch, writer, primary, term)

    async def _refused(self, r: PeerResponse, primary: str, term: int) -> None:
        """A stream the primary did not serve: 409 says why (wrong term, or we must be
        re-copied); any other status is an error."""
        if r.status != 409:
            raise PeerError(f"the primary answered {r.status}: {r.body[:200]!r}")
        answer = r.json()
        reason = answer.get("error", "refused")
        if self.problem != reason:
            log.warning("the primary at %s refuses us: %s", primary, reason)
        self.problem = reason
        if self.on_recopy is not None and reason in RECOPY:
            async with self.applying:  # the last frames' LMDB commit has ended
                pass
            await self.on_recopy(primary)
        if int(answer.get("term") or 0) > term:
            # A newer term than ours (a switchover, seconds before the Lease's
            # retry period would tell us): read the Lease now.
            self.roles.wake()
        await self._news()

    async def _news(self) -> None:
        """Wait for the role loop's next change, a retry period at most."""
        changed = self.roles.state.changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), self.retry_period)

    def _answer_term(self, answer_term: int, term: int) -> bool:
        """Whether an answer of ``answer_term`` may be applied (not a deposed primary's)."""
        if answer_term < self.highest_term:
            self.problem = f"refused an answer of term {answer_term} (seen {self.highest_term})"
            return False
        if answer_term > term:
            self.roles.wake()  # the answer of a primary that just handed over: read the Lease
        self.highest_term = answer_term
        return True

    async def _apply(self, frames: list[tuple[int, bytes]], commit: int) -> Job | None:
        """Make ``frames`` durable here (the job, once they are; None without frames)
        and start their LMDB commit; readers see them up to ``commit``."""
        self.commit = max(self.commit, commit)
        if not frames:
            if not self.applying.locked():  # else the LMDB commit under way publishes
                self._publish()
            return None
        await self.applying.acquire()  # the previous frames' LMDB commit has ended
        try:
            if not self.following:
                self.applying.release()
                return None
            job = self.applier.submit([f for _, f in frames])
            await job.written
        except BaseException:
            self.applying.release()
            raise
        # Durable here: the acknowledgement may go while the LMDB commit runs; the
        # lock keeps the next frames behind it.
        self._finishing = asyncio.create_task(self._finish(job, frames), name="replication apply")
        return job

    def _publish(self) -> None:
        """Readers here see the frames up to the commit point we know (those applied)."""
        self.mirror.publish(self.commit)
        self.freshness.visible(self.mirror.published)

    def _in_order(self, frames: list[tuple[int, int, bytes]]) -> list[tuple[int, bytes]]:
        """The frames after our durable position, as (term, frame)."""
        kept: list[tuple[int, bytes]] = []
        expect = self.hooks.durable[1] + 1
        for t, lsn, frame in frames:
            if lsn < expect:
                continue
            if lsn != expect:
                raise ValueError(f"frame {lsn} does not follow our lsn {expect - 1}")
            kept.append((t, frame))
            self.received = (t, lsn)
            expect += 1
        return kept

    async def _finish(self, job: Job, frames: list[tuple[int, bytes]]) -> None:
        """LMDB and the tails for frames already durable, then what readers here see.
        Holds ``applying`` (taken by ``_apply``) until done."""
        try:
            applied = await job.committed
            written = job.written.result()
            prior = written.prior if written is not None else []
            for i, ((t, frame), (lsn, _, changes)) in enumerate(zip(frames, applied, strict=True)):
                self.shipper.add(t, lsn, frame)
                self.mirror.stage(lsn, changes, prior[i] if i < len(prior) else None)
            self._publish()
        except Exception as exc:  # the engine failed closed: the next answer is refused
            self.problem = f"applying frames failed: {exc!r}"
            log.error("applying frames from the primary failed: %r", exc)
        finally:
            self.applying.release()


async def _messages(
    reader: asyncio.StreamReader, buffer: bytearray
) -> tuple[list[wire.Shipped], int, int]:
    """The whole messages of a stream buffered or read next (at least one): their
    frames, the highest commit point and the highest echo (``wire.take_messages``)."""
    while (taken := wire.take_messages(buffer)) is None:
        data = await reader.read(READ_SIZE)
        if not data:
            raise PeerError("the stream ended (closed by the primary, or silent too long)")
        buffer += data
    return taken


async def unless_stale(request: Awaitable[T], stale: Callable[[], bool], period: float) -> T | None:
    """``request``'s answer, or None (``request`` cancelled) once ``stale()`` says, looked
    at every ``period`` seconds, that the answer is no longer wanted."""
    task = asyncio.ensure_future(request)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=period)
            if done:
                return task.result()
            if stale():
                return None
    finally:
        task.cancel()
