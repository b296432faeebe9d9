"""The replica set as the app sees it: the role loop, the switch between primary
and standby mode, what this replica refuses, and ``GET /replication``.

Over 400 lines because it is where the parts meet: each piece of logic lives in
its own module (roles, shipping, follower, mirror, identity, reads, snapshot,
switchover), and this one holds what needs several of them at once: the role
switch, the refusals, the peer endpoints' checks and the re-copy.

Primary mode: the engine accepts batches under the Lease's term and the
pipeline's ack gate is the shipper's. Standby mode: the engine refuses every
batch of its own (only the follower's frames are written), the stream layer's
queued changes are rolled back, and the follower runs. A switch waits for the
other mode's writer to be idle first, so the two never touch the engine at
once.

Work that writes on its own runs only in primary mode: the store's expiry and
retention sweepers, and whatever the app registers (``primary_work``: the
subscriptions). It starts once this replica is primary and stops, with
nothing in flight, before it follows another one.

Writes reaching a standby are refused with 503, ``Retry-After: 1`` and
``Stream-Primary: <url>`` rather than forwarded (docs/replication.md says
why). A primary with fewer than ``min_in_sync`` replicas in sync waits up to
``replication_wait`` for them, then refuses with 503 too; in ``preferred``
durability it writes alone and reports itself degraded. During a switchover
(``switchover.py``) writes are held the same way, and refused 503 with
``Stream-Primary`` naming the new primary once this replica has handed over.

Reads are answered only while this replica knows it is current within
``replication_read_staleness`` (``reads.py``, the protocol layer's read gate).

With ``--replication-token-file`` the peer endpoints (fetch, snapshot,
switchover) need the set's shared secret, and this replica sends it on its own
fetches and snapshot requests (``peer_token.py``). Every connection to a peer
(the follower's, the snapshot download) checks an https peer's certificate
with one client context (``peer_tls.py``: ``--replication-ca-file``, and the
client certificate of ``--replication-cert-file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from stream_format.layout import Layout
from stream_server.engine.replica import AckGate, ReplicaHooks, stamp_base
from stream_server.replication import identity, snapshot
from stream_server.replication.follower import Follower
from stream_server.replication.freshness import Freshness
from stream_server.replication.lease import LeaseClient
from stream_server.replication.mirror import Mirror
from stream_server.replication.peer_tls import PeerTls
from stream_server.replication.peer_token import PeerToken
from stream_server.replication.pod_labels import PodClient, PodMarker
from stream_server.replication.reads import RETRY_AFTER, ReadFence
from stream_server.replication.roles import RoleConfig, RoleLoop
from stream_server.replication.sender import Sender
from stream_server.replication.settings import (
    ReplicationSettings,
    heartbeat,
    quorum,
    replica_name,
)
from stream_server.replication.shipping import FetchAnswer, Shipper
from stream_server.replication.switchover import Switchover, SwitchoverAnswer, parse_request
from stream_server.streams.replicated import ReplicatedStreams
from stream_server.streams.store import StreamStore

log = logging.getLogger("stream_server.replication")

# Seconds a primary that is stopping spends at most on handing the Lease over; within
# the server's stop, which a pod's termination grace period (30 s) bounds.
STOP_SWITCHOVER_TIMEOUT = 5.0
PEER_QUESTION_TIMEOUT = 2.0  # seconds to ask a standby whose stream ended which term it follows


@dataclass(frozen=True, slots=True)
class PrimaryWork:
    """Work that writes of its own accord: started on promotion, stopped on demotion."""

    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class StoreFactory(Protocol):
    """Builds the store on an engine joined to ``replica`` (``Engine(replica=)``) and a
    pipeline whose batches wait at ``gate`` (``StreamStore(gate=)``)."""

    def __call__(self, replica: ReplicaHooks, gate: AckGate) -> StreamStore: ...


class Replication:
    def __init__(self, settings: ReplicationSettings, build_store: StoreFactory) -> None:
        """The engine's hooks and the pipeline's gate are this object's, and the store
        is built on them (``build_store``): everything is joined by constructors, in
        the order the references run, before anything opens or starts."""
        self.settings = settings
        self.name = replica_name(settings)
        self.quorum = quorum(settings)
        # Each batch's frame goes to the shipper once durable (made below, before the
        # engine can commit anything).
        self.hooks = ReplicaHooks(on_frame=lambda t, lsn, f: self.shipper.on_frame(t, lsn, f))
        # Which set the data directory belongs to, and what it may do (identity.py).
        self.identity = identity.SetIdentity(
            Layout(settings.data_dir), self.name, settings.replication_bootstrap
        )
        self.roles = RoleLoop(
            LeaseClient(settings.replication_lease, settings.kube_api),
            RoleConfig(
                name=self.name,
                url=settings.replica_url,
                lease_duration=settings.lease_duration,
                renew_deadline=settings.lease_renew_deadline,
                retry_period=settings.lease_retry_period,
                keeps_eligible=settings.replication_durability == "required",
            ),
            position=lambda: self.hooks.durable,
            failed=lambda: self.store.engine.failed or None,
            identity=self.identity,
            reported=lambda: self.shipper.positions(),
        )
        self.shipper = Shipper(
            self.roles,
            self.hooks,
            quorum=self.quorum,
            preferred=settings.replication_durability == "preferred",
            wait=settings.replication_wait,
            renew_deadline=settings.lease_renew_deadline,
            on_stream_lost=self._ask_why_it_left,
        )
        self.store = store = build_store(self.hooks, self.shipper)
        # The Lease holder labels the pods itself (pod_labels.py); None: no pod named.
        self.pods: PodMarker | None = None
        if settings.replication_pod:
            self.pods = PodMarker(
                PodClient(settings.replication_lease.partition("/")[0], settings.kube_api),
                self.roles,
                settings.replication_pod,
                settings.replication_set_size,
                every=settings.lease_duration,
            )
        self.streams = ReplicatedStreams(store)
        self.mirror = Mirror(self.streams, lambda: store.engine.lsn)
        self.freshness = Freshness(settings.replication_read_staleness)
        # The protocol layer's read gate (``reads.py``).
        self.reads = ReadFence(settings, self.roles, self.freshness, lambda: self.primary_mode)
        self.peer_token = (
            PeerToken(settings.replication_token_file) if settings.replication_token_file else None
        )
        # One client context for every connection to a peer (``peer_tls.py``).
        self.peer_tls = PeerTls(settings)
        self.follower = Follower(
            self.roles,
            store.engine,
            self.hooks,
            self.shipper,
            self.mirror,
            retry_period=settings.lease_retry_period,
            freshness=self.freshness,
            recopy=self.recopy,
            join=self._join,
            set_id=lambda: self.identity.set_id,
            auth=self.peer_headers,
            tls=self.peer_tls.context,
        )
        # Each follower's origin, as its fetches give it: a switchover names it primary.
        self.peer_urls: dict[str, str] = {}
        self.switchover = Switchover(
            name=self.name,
            roles=self.roles,
            shipper=self.shipper,
            pipeline=store.pipeline,
            hooks=self.hooks,
            lsn=lambda: store.engine.lsn,
            peer_urls=self.peer_urls,
            primary_mode=lambda: self.primary_mode,
            stop_work=self.stop_primary_work,
            start_work=self.start_primary_work,
        )
        self.primary_mode = False
        self.failovers = 0  # times this replica became primary
        self._tasks: list[asyncio.Task[None]] = []
        self._asking: set[asyncio.Task[None]] = set()  # ``_check_term_of`` under way
        # Paused before the store starts them: a standby until the Lease says otherwise.
        store.expiry.pause()
        store.retention.pause()
        # What the app runs only while this replica is primary (``start``).
        self.primary_work: list[PrimaryWork] = []

    # ------------------------------------------------------------- lifecycle

    def start(
        self,
        ready: Callable[[], Awaitable[bool]] | None = None,
        primary_work: Iterable[PrimaryWork] = (),
    ) -> None:
        """Run once ``ready`` says the store recovered (the position is known); never
        when it says it did not; at once without it. ``primary_work``: what the app
        runs only while this replica is primary (the subscriptions), besides the
        store's sweepers."""
        self.primary_work = list(primary_work)
        self._tasks.append(asyncio.create_task(self._start(ready), name="replication start"))

    @property
    def switching(self) -> bool:
        """A switchover holds new writes (``switchover.py``)."""
        return self.switchover.switching

    async def _start(self, ready: Callable[[], Awaitable[bool]] | None) -> None:
        if ready is not None and not await ready():
            return  # recovery failed: the server stops
        await asyncio.to_thread(self._load)
        for term, lsn, frame in self.hooks.recovered:  # what the WAL held after a crash
            self.shipper.add(term, lsn, frame)
        self.hooks.recovered = []
        self.mirror.published = self.hooks.durable[1]
        self.store.pipeline.published = self.store.engine.lsn  # recovered: all published
        self.shipper.start()
        self.follower.start()
        self.roles.start()
        if self.pods is not None:
            self.pods.start()
        await self._coordinate()

    def _load(self) -> None:
        """The position, the term history and the set identity, after recovery."""
        self.hooks.load(self.store.engine)
        self.identity.load(self.store.engine, self.hooks)

    async def _join(self) -> str | None:
        """Before following: why this data directory may not join the Lease's set, or
        None once it holds the set's id (adopted when it had none)."""
        record = self.roles.record
        return await self.identity.join(record.set_id if record is not None else "")

    async def hand_over_before_stopping(self) -> None:
        """A primary asked to stop (SIGTERM: a node drain, a restart the operator did
        not plan) first hands the Lease to its most advanced in-sync standby, by the
        switchover's steps, as Patroni's leader gives up its key and Kafka's
        controlled shutdown moves leadership before the process ends. The set then
        pauses writes for a switchover (tens of milliseconds) instead of refusing
        them until the Lease runs out (``lease_duration``). When it cannot be done
        (no standby in sync, the target too slow), the stop goes on and the Lease
        runs out as before. A standby has nothing to hand over."""
        if not self.primary_mode:
            return
        answer = await self.switchover.run(None, STOP_SWITCHOVER_TIMEOUT)
        if answer.status != 200:
            log.warning("stopping as primary without a switchover: %s", answer.body)

    async def stop(self) -> None:
        await self.shipper.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.follower.stop()
        if self.pods is not None:
            await self.pods.stop()
        await self.roles.stop()

    async def _coordinate(self) -> None:
        await self._to_standby()
        while True:
            changed = self.roles.state.changed
            if self.roles.is_primary and not self.primary_mode:
                await self._to_primary()
            elif not self.roles.is_primary and self.primary_mode:
                await self._to_standby()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.settings.lease_retry_period)

    async def _to_primary(self) -> None:
        self.follower.following = False
        async with self.follower.applying:  # the last fetched frames are written
            pass
        # Everything this replica holds becomes its history under the new term.
        self.mirror.publish(self.store.engine.lsn)
        self.store.pipeline.published = self.store.engine.lsn
        term = self.roles.state.term
        self.hooks.term = term
        await self._stamp_base(term)
        self.shipper.became_primary(term)
        self.hooks.writable = True
        self.primary_mode = True
        self.failovers += 1
        log.info("primary for term %d at lsn %d", term, self.store.engine.lsn)
        await self.start_primary_work()

    async def _stamp_base(self, term: int) -> None:
        """Data from before this directory joined a set (single-node data, whose replica
        just created the Lease) gets a position before anything is written or shipped
        (``engine.replica.stamp_base``): a follower then re-copies it rather than
        follow frames that start after it."""
        if self.hooks.durable != (0, 0) or not self.identity.data:
            return
        position = await asyncio.to_thread(stamp_base, self.store.engine, self.hooks, term)
        self.identity.positioned = True
        log.warning(
            "the data written before this replica set began is its history up to %s: "
            "standbys re-copy it",
            position,
        )

    async def start_primary_work(self) -> None:
        self.store.expiry.resume()
        self.store.retention.resume()
        for work in self.primary_work:
            try:
                await work.start()
            except Exception:  # the role switch must not fail with it
                log.exception("could not start %s as primary", work.name)

    async def stop_primary_work(self) -> None:
        self.store.expiry.pause()
        self.store.retention.pause()
        for work in reversed(self.primary_work):
            try:
                await work.stop()
            except Exception:
                log.exception("could not stop %s", work.name)

    async def _to_standby(self) -> None:
        self.primary_mode = False
        self.shipper.close_streams()  # each standby asks again and hears the new term
        await self.stop_primary_work()  # before anything is rolled back or followed
        self.hooks.writable = False
        await self.store.pipeline.drained()
        self.streams.rollback()  # queued changes of ours will never be published
        self._stage_unpublished()
        self.follower.following = True
        log.info("standby of %s (term %d)", self.roles.state.primary_url, self.roles.state.term)

    def _stage_unpublished(self) -> None:
        """Batches this replica wrote as primary that never passed the gate (held when
        it stopped being primary) are durable history here, in the WAL and LMDB, but
        missing from the stream layer: staged as a standby stages the frames it
        applies (``Mirror.stage_frames``)."""
        upto, lsn = self.store.pipeline.published, self.store.engine.lsn
        if upto >= lsn:
            return
        ring = self.shipper.ring
        if not self.mirror.stage_frames(upto, lsn, ring.since(ring.first_after(upto))):
            log.warning(
                "batches up to lsn %d were never published here and are no longer in "
                "memory: readers of this replica miss them until it restarts",
                lsn,
            )

    # -------------------------------------------------------------- requests

    @property
    def in_sync_enough(self) -> bool:
        return 1 + len(self.roles.state.in_sync) >= self.quorum

    @property
    def degraded(self) -> bool:
        return self.roles.is_primary and not self.in_sync_enough

    async def write_refusal(self) -> Refusal | None:
        """None when this replica may take a write now; else the answer to give."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.replication_wait
        while True:
            state = self.roles.state
            if not (self.primary_mode and self.roles.may_acknowledge):
                return self._not_primary()
            if not self.switching and (
                self.in_sync_enough or self.settings.replication_durability == "preferred"
            ):
                return None
            left = deadline - loop.time()
            if left <= 0:
                why = (
                    "a switchover is in progress: retry\n"
                    if self.switching
                    else f"too few replicas in sync: {1 + len(state.in_sync)} of the "
                    f"{self.quorum} required\n"
                )
                return Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], why.encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.changed.wait(), left)

    def _not_primary(self) -> Refusal:
        primary = self.roles.state.primary_url
        headers = [(b"retry-after", str(RETRY_AFTER).encode())]
        if primary and not self.roles.is_primary:
            headers.append((b"stream-primary", primary.encode()))
            body = f"this replica is a standby; write to the primary at {primary}\n"
        else:
            body = "this replica is not the primary right now; retry\n"
        return Refusal(503, headers, body.encode())

    def set_refusal(
        self, set_id: str, position: identity.Position | None = None
    ) -> FetchAnswer | None:
        """A 409 for a follower of another set, or for one with no set id at (0, 0)
        while we hold a history (``identity.refusal``), or None."""
        body = identity.refusal(
            self.identity.set_id, set_id, position, self.hooks.durable, self.roles.state.term
        )
        if body is None:
            return None
        if body["error"] == identity.OTHER_SET:
            log.warning("refused a follower of set %s: this is set %s", set_id, body["set"])
        return FetchAnswer(409, {"content-type": "application/json"}, json.dumps(body).encode())

    def _ask_why_it_left(self, name: str) -> None:
        url = self.peer_urls.get(name)
        if url is not None:
            task = asyncio.create_task(self._check_term_of(url), name=f"term of {name}")
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _check_term_of(self, url: str) -> None:
        """Ask a standby whose stream ended which term it follows (``GET /replication``);
        a newer one than ours means we were deposed (``RoleLoop.deposed``)."""
        try:
            async with httpx.AsyncClient(
                timeout=PEER_QUESTION_TIMEOUT, verify=self.peer_tls.context()
            ) as http:
                answer = (await http.get(f"{url}/replication")).json()
            term, primary = int(answer["term"]), answer.get("primary")
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.info("could not ask %s which term it follows: %s", url, exc)
            return
        await self.roles.deposed(term, primary if isinstance(primary, str) else None)

    async def snapshot(self, set_id: str = "") -> Path | FetchAnswer | None:
        """A consistent copy of our data for a standby that must re-copy (a tar file
        the caller removes once sent); a 409 for another set's replica; None unless
        we are the primary."""
        if not self.primary_mode:
            return None
        refused = self.set_refusal(set_id)
        if refused is not None:
            return refused
        fd, name = tempfile.mkstemp(dir=self.store.engine.layout.root, prefix=".snapshot-")
        os.close(fd)
        out = Path(name)
        try:
            await asyncio.to_thread(snapshot.build, self.store.engine, out)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(out.unlink, missing_ok=True))
            raise
        return out

    async def recopy(self, primary: str) -> None:
        """Replace our data with the primary's copy, then exec ourselves again: the
        first version of catching up when frames cannot do it (docs/replication.md)."""
        if self.primary_mode:
            return
        self.follower.following = False
        root = self.store.engine.layout.root
        tar = root / ".recopy.tar"
        log.warning("re-copying everything from the primary at %s", primary)
        try:
            await self._download_snapshot(primary, tar)
        except (httpx.HTTPError, RuntimeError, OSError) as exc:
            log.error("re-copy from %s failed, will retry: %s", primary, exc)
            await asyncio.to_thread(tar.unlink, missing_ok=True)
            self.follower.following = not self.primary_mode
            return
        await self.roles.stop()
        await self.store.stop()
        await asyncio.to_thread(snapshot.install, root, tar)
        log.warning("re-copy installed: restarting to recover from it")
        snapshot.restart_process()

    async def _download_snapshot(self, primary: str, tar: Path) -> None:
        """The primary's snapshot into ``tar``; the file is written off the event loop
        (a standby's live readers and probes go on meanwhile)."""
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(60.0), verify=self.peer_tls.context()) as http,
            http.stream(
                "GET",
                f"{primary}/replication/snapshot",
                params={"set": self.identity.set_id},
                headers=self.peer_headers(),
            ) as r,
        ):
            if r.status_code != 200:
                raise RuntimeError(f"the primary answered {r.status_code}")
            f = await asyncio.to_thread(tar.open, "wb")
            try:
                async for chunk in r.aiter_bytes():
                    await asyncio.to_thread(f.write, chunk)
            finally:
                await asyncio.to_thread(f.close)

    def _admit(
        self, name: str, url: str, set_id: str, position: identity.Position
    ) -> FetchAnswer | None:
        """What a stream and a fetch check first: the follower's set (a 409 for another
        set's), then its origin is remembered (a switchover names it primary)."""
        refused = self.set_refusal(set_id, position)
        if refused is None and url.startswith(("http://", "https://")):
            self.peer_urls[name] = url.rstrip("/")
        return refused

    async def fetch(
        self,
        name: str,
        term: int,
        after_term: int,
        after_lsn: int,
        committed: int,
        url: str = "",
        set_id: str = "",
    ) -> FetchAnswer:
        refused = self._admit(name, url, set_id, (after_term, after_lsn))
        if refused is not None:
            return refused
        return await self.shipper.fetch(name, term, after_term, after_lsn, committed)

    def stream(
        self,
        name: str,
        term: int,
        after_term: int,
        after_lsn: int,
        committed: int,
        url: str = "",
        set_id: str = "",
        version: int = 2,
    ) -> FetchAnswer | Sender:
        """A standby's stream (``sender.py``, of that wire ``version``), or why it cannot
        follow us (a fetch's 409)."""
        refused = self._admit(name, url, set_id, (after_term, after_lsn)) or self.shipper.refusal(
            term, after_term, after_lsn
        )
        if refused is not None:
            return refused
        self.shipper.note(name, after_term, after_lsn)
        return Sender(
            self.shipper, name, after_lsn, committed, heartbeat(self.settings), version=version
        )

    # ---------------------------------------------------------- peers, switchover

    def peer_allowed(self, authorization: str | None) -> bool:
        """Whether a request to a peer endpoint may proceed (always, without a token)."""
        return self.peer_token is None or self.peer_token.allows(authorization)

    def peer_headers(self) -> dict[str, str]:
        return self.peer_token.headers() if self.peer_token is not None else {}

    async def switchover_request(self, body: bytes) -> SwitchoverAnswer:
        """``POST /replication/switchover``: its optional JSON body, then the switch."""
        asked = parse_request(body)
        if isinstance(asked, SwitchoverAnswer):
            return asked
        return await self.switchover.run(*asked)

    def status(self) -> dict[str, object]:
        state = self.roles.state
        term, lsn = self.hooks.durable
        primary = self.primary_mode
        return {
            # Primary only while it may acknowledge: past its renew deadline (an API
            # call hanging, a pause) it is no longer one, whatever the next round says.
            "role": "primary" if primary and self.roles.may_acknowledge else "standby",
            "name": self.name,
            "term": state.term,
            "primary": state.primary_url,
            "durable": {"term": term, "lsn": lsn},
            "committed": self.shipper.commit_point() if primary else self.mirror.published,
            "in_sync": list(state.in_sync),
            "eligible": list(state.eligible),
            "durability": self.settings.replication_durability,
            "degraded": self.degraded,
            "min_in_sync": self.quorum,
            "set_size": self.settings.replication_set_size,
            "followers": {n: {"term": t, "lsn": x} for n, (t, x) in self.shipper.acked.items()}
            if primary
            else {},
            "problem": None if primary else (self.identity.problem or self.follower.problem),
            "set_id": self.identity.set_id,
            "failovers": self.failovers,
            "fresh_for": round(self.reads.fresh_for(), 3),
            "read_staleness": self.settings.replication_read_staleness,
        }
