"""The replica set as the app sees it: the role loop, the switch between primary
and standby mode, what this replica refuses, and ``GET /replication``.

Each piece of logic lives in its own module (roles, shipping, follower,
mirror, identity, reads, snapshot, switchover, and the switch between primary
and standby mode, ``role_switch.py``); this one builds them in the order their
references run and holds what needs several at once: the refusals, the peer
endpoints' checks and the re-copy.

Writes are let through, held or refused by the write fence
(``write_fence.py``); during a switchover (``switchover.py``) they are held
the same way, and refused 503 with ``Stream-Primary`` naming the new primary
once this replica has handed over. A standby that must re-copy its data does
it by ``recopy.py``.

Reads are answered only while this replica knows it is current within
``replication_read_staleness`` (``read_fence.py``, the protocol layer's read gate).

With ``--replication-token-file`` the peer endpoints (stream, snapshot,
switchover) need the set's shared secret, and this replica sends it on its own
stream and snapshot requests (``peer_token.py``). Every connection to a peer
(the follower's, the snapshot download) checks an https peer's certificate
with one client context (``peer_tls.py``: ``--replication-ca-file``, and the
client certificate of ``--replication-cert-file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from stream_format.layout import Layout
from stream_server.engine.replica import AckGate, ReplicaHooks
from stream_server.replication import identity
from stream_server.replication.fences.read_fence import ReadFence
from stream_server.replication.fences.write_fence import WriteFence
from stream_server.replication.lease.kube_lease import LeaseClient
from stream_server.replication.lease.pod_labels import PodClient, PodMarker
from stream_server.replication.lease.roles import RoleConfig, RoleLoop
from stream_server.replication.lease.term_question import TermQuestion
from stream_server.replication.peers.peer_tls import PeerTls
from stream_server.replication.peers.peer_token import PeerToken
from stream_server.replication.primary.sender import Sender
from stream_server.replication.primary.shipping import Refusal, Shipper
from stream_server.replication.primary_work import PrimaryWork
from stream_server.replication.recopy import Recopy
from stream_server.replication.role_switch import RoleSwitch
from stream_server.replication.settings import (
    ReplicationSettings,
    heartbeat,
    quorum,
    replica_name,
)
from stream_server.replication.standby.freshness import Freshness
from stream_server.replication.standby.mirror import Mirror
from stream_server.replication.standby.receiver import Follower
from stream_server.replication.switchover import Switchover, SwitchoverResponse, parse_request
from stream_server.streams.replicated import ReplicatedStreams
from stream_server.streams.store import StreamStore

__all__ = ["PrimaryWork", "Replication", "StoreFactory"]

log = logging.getLogger("stream_server.replication")

# Seconds a primary that is stopping spends at most on handing the Lease over; within
# the server's stop, which a pod's termination grace period (30 s) bounds.
STOP_SWITCHOVER_TIMEOUT = 5.0


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
            term_floor=lambda: self.hooks.term_floor,
        )
        # One client context for every connection to a peer (``peer_tls.py``).
        self.peer_tls = PeerTls(settings)
        # Each follower's origin, as its stream requests give it: a switchover names it primary.
        self.peer_urls: dict[str, str] = {}
        self.term_question = TermQuestion(self.roles, self.peer_urls, self.peer_tls.context)
        self.shipper = Shipper(
            self.roles,
            self.hooks,
            quorum=self.quorum,
            preferred=settings.replication_durability == "preferred",
            wait=settings.replication_wait,
            renew_deadline=settings.lease_renew_deadline,
            on_stream_lost=self.term_question.ask,
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
        # The protocol layer's read gate (``read_fence.py``).
        self.read_fence = ReadFence(
            settings,
            self.roles,
            self.freshness,
            lambda: self.primary_mode,
            lambda: self.shipper.settled,
        )
        self.peer_token = (
            PeerToken(settings.replication_token_file) if settings.replication_token_file else None
        )
        self.follower = Follower(
            self.roles,
            store.engine,
            self.hooks,
            self.shipper,
            self.mirror,
            retry_period=settings.lease_retry_period,
            freshness=self.freshness,
            recopy=lambda primary: self.recopy.run(primary),
            join=self._join,
            set_id=lambda: self.identity.set_id,
            auth=self.peer_headers,
            tls=self.peer_tls.context,
        )
        self.role_switch = RoleSwitch(
            roles=self.roles,
            store=store,
            streams=self.streams,
            hooks=self.hooks,
            shipper=self.shipper,
            follower=self.follower,
            mirror=self.mirror,
            identity=self.identity,
            retry_period=settings.lease_retry_period,
        )
        self.switchover = Switchover(
            name=self.name,
            roles=self.roles,
            shipper=self.shipper,
            pipeline=store.pipeline,
            hooks=self.hooks,
            lsn=lambda: store.engine.lsn,
            peer_urls=self.peer_urls,
            primary_mode=lambda: self.primary_mode,
            stop_work=self.role_switch.stop_primary_work,
            start_work=self.role_switch.start_primary_work,
        )
        self.recopy = Recopy(
            store=store,
            roles=self.roles,
            modes=self.role_switch,
            follower=self.follower,
            identity=self.identity,
            refusal=self.set_refusal,
            tls=self.peer_tls.context,
            auth=self.peer_headers,
        )
        # What the app asks before each write (``write_fence.py``).
        self.writes = WriteFence(
            settings, self.roles, self.quorum, self.role_switch, self.switchover
        )
        self._tasks: list[asyncio.Task[None]] = []

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
        self._tasks.append(
            asyncio.create_task(self._start(ready, list(primary_work)), name="replication start")
        )

    @property
    def primary_mode(self) -> bool:
        """In primary mode (``role_switch.py``): the engine writes, the gate ships."""
        return self.role_switch.primary

    @property
    def failovers(self) -> int:
        """Times this replica became primary."""
        return self.role_switch.failovers

    @property
    def switching(self) -> bool:
        """A switchover holds new writes (``switchover.py``)."""
        return self.switchover.switching

    async def _start(
        self, ready: Callable[[], Awaitable[bool]] | None, primary_work: list[PrimaryWork]
    ) -> None:
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
        await self.role_switch.run(primary_work)

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

    # -------------------------------------------------------------- requests

    @property
    def degraded(self) -> bool:
        return self.roles.is_primary and not self.writes.in_sync_enough

    def set_refusal(self, set_id: str, position: identity.Position | None = None) -> Refusal | None:
        """A 409 for a follower of another set, or for one with no set id at (0, 0)
        while we hold a history (``identity.refusal``), or None."""
        body = identity.refusal(
            self.identity.set_id, set_id, position, self.hooks.durable, self.roles.state.term
        )
        if body is None:
            return None
        if body["error"] == identity.OTHER_SET:
            log.warning("refused a follower of set %s: this is set %s", set_id, body["set"])
        return Refusal(409, {"content-type": "application/json"}, json.dumps(body).encode())

    def _admit(
        self, name: str, url: str, set_id: str, position: identity.Position
    ) -> Refusal | None:
        """What a stream request checks first: the follower's set (a 409 for another
        set's), then its origin is remembered (a switchover names it primary)."""
        refused = self.set_refusal(set_id, position)
        if refused is None and url.startswith(("http://", "https://")):
            self.peer_urls[name] = url.rstrip("/")
        return refused

    def stream(
        self,
        name: str,
        term: int,
        after_term: int,
        after_lsn: int,
        committed: int,
        url: str = "",
        set_id: str = "",
    ) -> Refusal | Sender:
        """A standby's stream (``sender.py``), or why it cannot follow us (a 409)."""
        refused = self._admit(name, url, set_id, (after_term, after_lsn)) or self.shipper.refusal(
            term, after_term, after_lsn
        )
        if refused is not None:
            return refused
        self.shipper.note(name, after_term, after_lsn)
        return Sender(self.shipper, name, after_lsn, committed, heartbeat(self.settings))

    # ---------------------------------------------------------- peers, switchover

    def peer_allowed(self, authorization: str | None) -> bool:
        """Whether a request to a peer endpoint may proceed (always, without a token)."""
        return self.peer_token is None or self.peer_token.allows(authorization)

    def peer_headers(self) -> dict[str, str]:
        return self.peer_token.headers() if self.peer_token is not None else {}

    async def switchover_request(self, body: bytes) -> SwitchoverResponse:
        """``POST /replication/switchover``: its optional JSON body, then the switch."""
        asked = parse_request(body)
        if isinstance(asked, SwitchoverResponse):
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
            "fresh_for": round(self.read_fence.fresh_for(), 3),
            "read_staleness": self.settings.replication_read_staleness,
        }
