"""The switch between primary and standby mode, as the Lease's role changes.

Primary mode: the engine accepts batches under the Lease's term and the
pipeline's ack gate is the shipper's. Standby mode: the engine refuses every
batch of its own (only the follower's frames are written), the stream layer's
queued changes are rolled back, and the follower runs. A switch waits for the
other mode's writer to be idle first, so the two never touch the engine at
once.

Work that writes on its own runs only in primary mode: the store's expiry and
retention sweepers, and whatever the app registers (``PrimaryWork``: the
subscriptions). It starts once this replica is primary and stops, with
nothing in flight, before it follows another one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from stream_server.engine.replica import ReplicaHooks, stamp_base
from stream_server.replication.identity import SetIdentity
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.primary.shipping import Shipper
from stream_server.replication.primary_work import PrimaryWork
from stream_server.replication.standby.mirror import Mirror
from stream_server.replication.standby.receiver import Follower
from stream_server.streams.replicated import ReplicatedStreams
from stream_server.streams.store import StreamStore

log = logging.getLogger("stream_server.replication")


class RoleSwitch:
    """Follows the role loop's state into primary or standby mode (``run``)."""

    def __init__(
        self,
        *,
        roles: RoleLoop,
        store: StreamStore,
        streams: ReplicatedStreams,
        hooks: ReplicaHooks,
        shipper: Shipper,
        follower: Follower,
        mirror: Mirror,
        identity: SetIdentity,
        retry_period: float,
    ) -> None:
        self.roles = roles
        self.store = store
        self.streams = streams
        self.hooks = hooks
        self.shipper = shipper
        self.follower = follower
        self.mirror = mirror
        self.identity = identity
        self.retry_period = retry_period
        self.primary = False  # in primary mode (the engine writes, the gate ships)
        self.failovers = 0  # times this replica became primary
        # What the app runs only while this replica is primary (given to ``run``).
        self.work: list[PrimaryWork] = []
        # Paused before the store starts them: a standby until the Lease says otherwise.
        store.pause_own_writes()

    async def run(self, work: list[PrimaryWork]) -> None:
        """Standby first, then whichever mode the role loop's state names, switched
        on each of its changes (and re-checked every retry period). ``work``: what
        the app runs only while this replica is primary, besides the store's
        sweepers (the subscriptions)."""
        self.work = work
        await self._to_standby()
        while True:
            changed = self.roles.state.changed
            if self.roles.is_primary and not self.primary:
                await self._to_primary()
            elif not self.roles.is_primary and self.primary:
                await self._to_standby()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.retry_period)

    async def _to_primary(self) -> None:
        self.follower.following = False
        async with self.follower.applying:  # the last frames received are written
            pass
        # Everything this replica holds becomes its history under the new term.
        self.mirror.publish(self.store.engine.lsn)
        self.store.pipeline.published = self.store.engine.lsn
        term = self.roles.state.term
        self.hooks.term = term
        await self._stamp_base(term)
        # Past the last commit point we know of (heard as a standby, or ours as an earlier
        # primary), what we hold may be rolled back if an eligible replica is elected.
        known = max(self.follower.commit, self.shipper.confirmed)
        unsettled = bool(self.roles.state.eligible) and self.store.engine.lsn > known
        self.shipper.became_primary(term, unsettled=unsettled, known=known)
        self.hooks.writable = True
        self.primary = True
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
        self.store.resume_own_writes()
        for work in self.work:
            try:
                await work.start()
            except Exception:  # the role switch must not fail with it
                log.exception("could not start %s as primary", work.name)

    async def stop_primary_work(self) -> None:
        self.store.pause_own_writes()
        for work in reversed(self.work):
            try:
                await work.stop()
            except Exception:
                log.exception("could not stop %s", work.name)

    async def _to_standby(self) -> None:
        self.primary = False
        self.shipper.close_streams()  # each standby asks again and hears the new term
        # The batches at the ack gate look again now, not at their next wake-up: this
        # replica may no longer acknowledge, so they leave the gate and the pipeline
        # drains. Were the Lease taken back meanwhile (the next round may run at once),
        # they would wait for a commit point that only ``became_primary`` can move,
        # which runs after the drain, and the role switch would never finish.
        self.shipper.changed.notify()
        await self.stop_primary_work()  # before anything is rolled back or followed
        self.hooks.writable = False
        await self.store.pipeline.drained()
        self.streams.rollback()  # queued changes of ours will never be published
        self._stage_unpublished()
        # Readers here see all this replica held when it started, or what it published
        # as primary (a tail it took over included): no read is current until a commit
        # point covers it (``Freshness.hold``), or the primary says we diverged.
        self.follower.freshness.hold(self.store.pipeline.published)
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
