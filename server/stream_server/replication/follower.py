"""A standby's fetch-and-apply loop (Kafka's replica fetcher).

While this replica is a standby of a known primary, it asks the primary for the
frames after its durable position, writes each through the engine's commit
path (one flush per answer), and makes the ones at or below the announced
commit point visible to its readers (``mirror``). Its next fetch names its
new position: that is its acknowledgement. It is sent once the frames are
durable (``engine.replica.write_frames``: segments, WAL, fdatasync), while
their LMDB commit (``commit_frames``) runs, both on the standby's writer
thread (``applier.py``); ``applying`` keeps the next answer's frames, a
promotion and a re-copy behind that commit.

An answer from a term older than the highest term seen is refused: it comes
from a deposed primary. A 409 says why the primary will not serve us (wrong
term: the role loop will catch up; diverged or too far behind: this replica
must be re-copied, shown in ``/replication`` as ``problem``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from stream_server.engine.engine import Engine
from stream_server.engine.replica import ReplicaHooks
from stream_server.replication.applier import Applier, Job, Sent
from stream_server.replication.mirror import Mirror
from stream_server.replication.peer_http import PeerClient, PeerError
from stream_server.replication.roles import RoleLoop
from stream_server.replication.shipping import FRAME_HEAD, Shipper

log = logging.getLogger("stream_server.replication")

RECOPY = ("diverged", "too far behind: re-copy")
FETCH_TIMEOUT = 15.0  # seconds: a fetch is answered within a second when the primary is alive


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
    ) -> None:
        self.roles = roles
        self.engine = engine
        self.hooks = hooks
        self.shipper = shipper
        self.mirror = mirror
        self.retry_period = retry_period
        self.applier = Applier(engine, hooks)
        self.following = False  # set by the service once the engine is in standby mode
        self.applying = asyncio.Lock()  # held while frames are being written
        self.highest_term = 0
        self.commit = 0  # the primary's last announced commit point
        self.problem: str | None = None
        self.fetched_at = 0.0  # our clock at the last good answer (lag in seconds)
        self._task: asyncio.Task[None] | None = None
        self._finishing: asyncio.Task[None] | None = None  # the last answer's LMDB commit
        self._sent = Sent()  # the writer thread's: our acknowledgement went out
        # The peer token's header (``peer_token.py``), sent on every fetch; none without.
        self.auth: Callable[[], dict[str, str]] = dict
        # Called when the primary says we cannot follow by frames (diverged, or too
        # far behind): the service re-copies this replica from the primary.
        self.on_recopy: Callable[[str], Awaitable[None]] | None = None

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
        http = PeerClient(timeout=FETCH_TIMEOUT)
        try:
            while True:
                state = self.roles.state
                if not self.following or self.roles.is_primary or not state.primary_url:
                    changed = state.changed
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), self.retry_period)
                    continue
                try:
                    await self._fetch_once(http, state.primary_url, state.term)
                except (PeerError, ValueError) as exc:
                    self.problem = f"fetch from {state.primary_url} failed: {exc!r}"
                    await asyncio.sleep(self.retry_period)
                except Exception:
                    log.exception("follower round failed")
                    await asyncio.sleep(self.retry_period)
        finally:
            await http.aclose()

    async def _fetch_once(self, http: PeerClient, primary: str, term: int) -> None:
        after_term, after_lsn = self.hooks.durable
        r = await http.get(
            f"{primary}/replication/fetch",
            params={
                "name": self.roles.config.name,
                "term": term,
                "after_term": after_term,
                "after_lsn": after_lsn,
                "committed": self.commit,
                "url": self.roles.config.url,  # what a switchover names as the new primary
            },
            headers=self.auth(),
            on_sent=self._sent.set,
        )
        if r.status == 409:
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
            changed = self.roles.state.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.retry_period)
            return
        if r.status != 200:
            raise PeerError(f"the primary answered {r.status}: {r.body[:200]!r}")
        answer_term = int(r.headers["replication-term"])
        if answer_term < self.highest_term:
            self.problem = f"refused an answer of term {answer_term} (seen {self.highest_term})"
            return
        if answer_term > term:
            self.roles.wake()  # the answer of a primary that just handed over: read the Lease
        self.highest_term = answer_term
        self.problem = None
        self.fetched_at = asyncio.get_running_loop().time()
        frames = self._frames(r.body)
        self.commit = max(self.commit, int(r.headers["replication-commit"]))
        if not frames:
            if not self.applying.locked():  # else the LMDB commit under way publishes
                self.mirror.publish(self.commit)
            return
        await self.applying.acquire()  # the previous answer's LMDB commit has ended
        try:
            if not self.following:
                self.applying.release()
                return
            job = self.applier.submit([f for _, f in frames])
            self._sent = job.sent  # set when our next fetch, the acknowledgement, is sent
            await job.written
        except BaseException:
            self.applying.release()
            raise
        # Durable here: our next fetch reports the new position (the acknowledgement)
        # while the LMDB commit runs; the lock keeps the next answer's frames behind it.
        self._finishing = asyncio.create_task(self._finish(job, frames), name="replication apply")

    def _frames(self, body: bytes) -> list[tuple[int, bytes]]:
        """The answer's frames after our durable position, as (term, frame)."""
        frames: list[tuple[int, bytes]] = []
        off = 0
        expect = self.hooks.durable[1] + 1
        while off < len(body):
            t, lsn, n = FRAME_HEAD.unpack_from(body, off)
            frame = body[off + FRAME_HEAD.size : off + FRAME_HEAD.size + n]
            off += FRAME_HEAD.size + n
            if lsn < expect:
                continue
            if lsn != expect:
                raise ValueError(f"frame {lsn} does not follow our lsn {expect - 1}")
            frames.append((t, frame))
            expect += 1
        return frames

    async def _finish(self, job: Job, frames: list[tuple[int, bytes]]) -> None:
        """LMDB and the tails for frames already durable, then what readers here see.
        Holds ``applying`` (taken by ``_fetch_once``) until done."""
        try:
            applied = await job.committed
            for (t, frame), (lsn, _, changes) in zip(frames, applied, strict=True):
                self.shipper.add(t, lsn, frame)
                self.mirror.stage(lsn, changes)
            self.mirror.publish(self.commit)
        except Exception as exc:  # the engine failed closed: the next answer is refused
            self.problem = f"applying frames failed: {exc!r}"
            log.error("applying frames from the primary failed: %r", exc)
        finally:
            self.applying.release()
