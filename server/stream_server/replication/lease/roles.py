"""The role loop: who is primary, decided only by CAS writes on the Lease.

Every ``lease_retry_period`` a replica reads the Lease and

- creates it with itself as holder and term 1 when there is none (the
  creation is itself a CAS: 409 to every other creator);
- renews it when it holds it, and steps down when no renewal has succeeded
  for ``lease_renew_deadline`` (shorter than the lease, so it stops
  acknowledging before anyone else may take over);
- takes it, with ``term + 1`` and an empty in-sync set, when it has expired
  and this replica is eligible: a member of the in-sync set, one of the
  ``eligible`` standbys (removed from it while nothing could be acknowledged
  without them, KIP-966), or the old holder: the replicas that hold every
  acknowledged write;
- takes it at the term it names, by a renewal, when the primary handed it
  over (a switchover, ``hand_over``): it names this replica under a term
  newer than any this process has followed, so nobody has written under it.

Expiry is judged, as client-go's leader election does, from when *this*
replica last saw the Lease change (its resourceVersion), stamped once the
answer that showed the change arrived, by its own clock (``boottime.py``, which
keeps counting through a suspend): the replicas' clocks need not agree, only
run at about the same rate (a primary stops acknowledging ``lease_duration -
lease_renew_deadline`` before anyone may take over). A write whose answer was
lost (a timeout, a cut connection) may still have happened: it is settled by
reading the Lease back before the primary acts on either outcome (``_settle``). At a cold start an
eligible replica whose reported position is behind another eligible one's
waits one more lease duration, so that the most advanced replica wins when
it is alive. The safety argument is in docs/replication.md.

Here are the rounds and every way this replica learns it was deposed (a round,
the Lease watch, the renew-deadline watchdog, a newer term heard from a
peer); the writes are ``lease_writes.py``, the state they change
``role_state.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from stream_server.replication.lease.kube_lease import LeaseUnavailable
from stream_server.replication.lease.lease_writes import LeaseWrites
from stream_server.replication.lease.role_state import Role, RoleConfig, RoleState

__all__ = ["Role", "RoleConfig", "RoleLoop", "RoleState"]

log = logging.getLogger("stream_server.replication")


class RoleLoop(LeaseWrites):
    """Runs the Lease protocol for one replica; ``step`` is one round (tests call it)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="replication role loop")
        self._watchdog = asyncio.create_task(self._watch_deadline(), name="renew deadline")
        self._watcher = asyncio.create_task(self._watch_lease(), name="Lease watch")

    async def stop(self) -> None:
        for task in (self._task, self._watchdog, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._watchdog = self._watcher = None
        await self.client.close()

    async def _watch_lease(self) -> None:
        """Run a round as soon as the Lease names another holder or term than we
        believe: a primary deposed while its clock ran slow, or whose round is far
        off, learns it when the new holder writes, not when its own clock says; a
        standby sees a Lease given up, or a new primary, at once. Rounds still
        decide everything; without a watch (an API that refuses it) they poll."""
        warned = False
        while True:
            try:
                async for record in self.client.watch():
                    if (record.holder, record.term) != (self.state.holder, self.state.term):
                        self.wake()
            except LeaseUnavailable as exc:
                if not warned:
                    log.warning("cannot watch the Lease (rounds poll it instead): %s", exc)
                    warned = True
            await asyncio.sleep(self.config.retry_period)

    async def _watch_deadline(self) -> None:
        """Step down at the renew deadline even while a round hangs on the API (a call
        can take its whole timeout): ``/replication`` and the work that only a
        primary does follow ``may_acknowledge`` within a moment, not a round later."""
        while True:
            changed = self.state.changed
            left = self.config.retry_period
            if self.is_primary:
                left = self._renewed_at + self.deadline - self.clock()
                if left <= 0:
                    await self._check_deadline()
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), max(left, 0.001))

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # the loop must outlive any one bad answer
                log.exception("replication role loop round failed")
                await self._check_deadline()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.retry_period)
            self._wake.clear()

    def wake(self) -> None:
        """Run the next round now rather than after the retry period: the follower
        heard of a newer term (a switchover named someone else, or this replica)."""
        self._wake.set()

    def notify(self) -> None:
        """Wake whoever waits on ``state.changed`` (held writes, after a switchover
        that did not happen)."""
        self._changed()

    async def step(self) -> None:
        """One round: read the Lease, then renew, acquire, or follow."""
        try:
            record = await self.client.get()
        except LeaseUnavailable as exc:
            log.warning("cannot read the Lease: %s", exc)
            await self._check_deadline()
            return
        # Stamped once the answer is here, as client-go does: the Lease may have
        # changed at any moment before, and an earlier stamp would end it too soon.
        now = self.clock()
        if record is None:
            await self._create(now)
            return
        self._observe(record, now)
        mine = record.holder == self.config.name
        if (reason := self.failed()) is not None:
            # Storage failed closed: this replica can neither write nor follow until a
            # restart. Holding the Lease would refuse every write for the set.
            if mine:
                await self._release(record, reason)
            else:
                await self._follow(record)
        elif mine and self.is_primary:
            await self._renew(record, now)
        elif mine and 0 < self.state.term < record.term and self._eligible(record):
            await self._take_handed_over(record, now)
        elif self._gave_up_at is not None and now - self._gave_up_at < self.config.lease_duration:
            # We gave the Lease up for want of a quorum (``give_up``): the others
            # go first for a lease duration. If our CAS was lost or refused, write it
            # again: waiting for the Lease to run out would not do, for another
            # replica that reported less than we hold waits a lease duration more,
            # and we would take it back first.
            if mine:
                await self._vacate(record, {*record.eligible, self.config.name})
            else:
                await self._follow(record)
        elif (mine and self._eligible(record) and not self._behind(record)) or (
            self._expired(record, now) and self._eligible(record)
        ):
            # Ours from before a restart or a step-down is taken back at once (under a
            # new term, so every standby refollows), unless another eligible replica
            # reported more: then, as for everyone, the most advanced goes first.
            await self._acquire(record, now)
        else:
            await self._follow(record)

    async def deposed(self, term: int, primary_url: str | None) -> None:
        """A peer follows a newer term than ours: the Lease names another holder, for
        terms only grow by a CAS on it. Step down now (no Lease write: always
        safe) rather than when our clock, perhaps slow, reaches the renew deadline;
        the next round reads the Lease."""
        if not self.is_primary or term <= self.state.term:
            return
        log.error(
            "a peer follows term %d while we lead term %d: stepping down", term, self.state.term
        )
        await self._demote(term, primary_url)
        self.wake()
