"""The role loop: who is primary, decided only by CAS writes on the Lease.

Over 400 lines because every write to the Lease (create, renew, acquire, take a
hand-over, hand over, release, give up for want of a quorum, change the in-sync
and eligible sets, settle a write whose answer was lost) and every way this
replica learns it was deposed (a round, the Lease watch, the renew-deadline
watchdog, a newer term heard from a peer) is here, next to the state they
change: the safety argument reads one module.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from stream_server.replication import boottime
from stream_server.replication.lease import (
    LeaseClient,
    LeaseConflict,
    LeaseRecord,
    LeaseUnavailable,
    Position,
    micro_time,
)

if TYPE_CHECKING:
    from stream_server.replication.identity import SetIdentity

log = logging.getLogger("stream_server.replication")

Role = Literal["primary", "standby"]


@dataclass
class RoleConfig:
    name: str
    url: str
    lease_duration: float
    renew_deadline: float
    retry_period: float
    # Durability "required": standbys removed from the in-sync set while too few were
    # in sync stay eligible (nothing could be acknowledged without them); "preferred"
    # acknowledges alone then, so they may not.
    keeps_eligible: bool = True


@dataclass
class RoleState:
    """What this replica believes now; replaced field by field on the event loop."""

    role: Role = "standby"
    term: int = 0
    primary_url: str | None = None
    holder: str = ""
    in_sync: list[str] = field(default_factory=list)
    eligible: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class RoleLoop:
    """Runs the Lease protocol for one replica; ``step`` is one round (tests call it)."""

    def __init__(
        self,
        client: LeaseClient,
        config: RoleConfig,
        *,
        position: Callable[[], Position] = lambda: (0, 0),
        on_demoted: Callable[[], Awaitable[None] | None] | None = None,
        clock: Callable[[], float] = boottime.now,
        failed: Callable[[], str | None] = lambda: None,
        identity: SetIdentity | None = None,
        reported: Callable[[], dict[str, Position]] = dict,
    ) -> None:
        self.client = client
        self.config = config
        self.position = position
        self.on_demoted = on_demoted
        self.clock = clock
        self.failed = failed
        # What the data directory holds and its set id (identity.py); None: no checks.
        self.identity = identity
        self.state = RoleState()
        self.record: LeaseRecord | None = None  # as last read or written
        self._seen_version = ""
        self._seen_at = 0.0  # our clock when the Lease last changed (or we first saw it)
        self._renewed_at = 0.0  # our clock when our last successful renewal was sent
        self._gave_up_at: float | None = None  # our clock when we last gave up for a quorum
        self._task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # The standbys' positions as the primary last saw them, written with each
        # renewal for a cold start's choice.
        self.reported = reported

    # ---------------------------------------------------------------- running

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
                left = self._renewed_at + self.config.renew_deadline - self.clock()
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

    # ------------------------------------------------------------------ rounds

    @property
    def is_primary(self) -> bool:
        return self.state.role == "primary"

    @property
    def may_acknowledge(self) -> bool:
        """Primary, and renewed within the renew deadline *now*: checked before every
        acknowledgement, so that a primary paused past its deadline (SIGSTOP, a long
        GC) acknowledges nothing when it wakes, before its next round even runs."""
        return self.is_primary and self.clock() - self._renewed_at < self.config.renew_deadline

    @property
    def acknowledge_for(self) -> float:
        """Seconds ``may_acknowledge`` stays true without another renewal (0: false)."""
        if not self.is_primary:
            return 0.0
        return max(0.0, self.config.renew_deadline - (self.clock() - self._renewed_at))

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
            # go first for a lease duration (if our CAS was lost, it runs out).
            if not mine:
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

    def _observe(self, record: LeaseRecord, now: float) -> None:
        if record.version != self._seen_version:
            self._seen_version = record.version
            self._seen_at = now
        self.record = record

    def _expired(self, record: LeaseRecord, now: float) -> bool:
        if not record.holder:
            return True
        wait = max(record.duration, self.config.lease_duration)
        if self._behind(record):
            wait += self.config.lease_duration
        return now - self._seen_at >= wait

    def _eligible(self, record: LeaseRecord) -> bool:
        """Only replicas that hold every acknowledged write may take over: in the set, or
        the old holder, and not behind the position last reported for it (a replica
        whose data directory was wiped or lost knows it from there)."""
        me = self.config.name
        if self.position() < record.positions.get(me, (0, 0)):
            return False
        if self.identity is not None and self.identity.mismatch(record.set_id) is not None:
            return False  # another set's data, or single-node data: never this set's line
        return (
            me in record.in_sync
            or me in record.eligible
            or me == record.holder
            or (not record.holder and not record.term)
        )

    def _behind(self, record: LeaseRecord) -> bool:
        """Another eligible replica reported a more advanced position than ours."""
        mine = self.position()
        others = [record.holder, *record.in_sync, *record.eligible]
        return any(record.positions.get(n, (0, 0)) > mine for n in others if n != self.config.name)

    async def _create(self, now: float) -> None:
        set_id = await self._creating()
        if set_id is None:
            return
        record = LeaseRecord(
            holder=self.config.name,
            duration=max(1, round(self.config.lease_duration)),
            renew_time=micro_time(),
            acquire_time=micro_time(),
            term=1,
            primary_url=self.config.url,
            positions={self.config.name: self.position()},
            began="election",
            set_id=set_id,
        )
        try:
            written = await self.client.create(record)
        except LeaseConflict:
            if self.identity is not None:
                await self.identity.forget()  # an id minted for this Lease: not ours
            return  # another replica was first: the next round follows it
        except LeaseUnavailable as exc:
            log.warning("cannot create the Lease: %s", exc)
            return
        log.info("created the Lease: primary for term 1")
        self._became_primary(written, now)

    async def _acquire(self, record: LeaseRecord, now: float) -> None:
        me = self.config.name
        # Everyone who was eligible stays so until this term has a quorum: nothing is
        # acknowledged before, so they still hold every acknowledged write, and one
        # of them can take over if we die first.
        eligible = (
            sorted({record.holder, *record.in_sync, *record.eligible} - {me, ""})
            if self.config.keeps_eligible
            else []
        )
        sent = self.clock()
        new = LeaseRecord(
            holder=self.config.name,
            duration=max(1, round(self.config.lease_duration)),
            renew_time=micro_time(),
            acquire_time=micro_time(),
            transitions=record.transitions + (record.holder != self.config.name),
            term=record.term + 1,
            primary_url=self.config.url,
            in_sync=[],  # standbys join again once caught up with the new term
            positions={**record.positions, self.config.name: self.position()},
            eligible=eligible,
            began="election",
            set_id=await self._set_id(record),
            version=record.version,
        )
        try:
            written = await self.client.replace(new)
        except LeaseConflict:
            return  # another candidate won: follow it next round
        except LeaseUnavailable as exc:
            log.warning("cannot take the Lease: %s", exc)
            return
        log.info("took the Lease: primary for term %d (was %r)", written.term, record.holder)
        self._became_primary(written, sent)

    async def _take_handed_over(self, record: LeaseRecord, now: float) -> None:
        """A switchover named us: renew at its term (the CAS proves the Lease is still
        ours, and starts our renew deadline as any renewal does), then be primary.

        No term bump: only a holder writes under a term, and this process has
        followed an older one until now, so nothing was written under this one.
        After a restart (``state.term`` 0) the usual take-back with a bump applies.
        """
        new = replace(
            record,
            renew_time=micro_time(),
            positions={**record.positions, self.config.name: self.position()},
        )
        sent = self.clock()
        try:
            written = await self.client.replace(new)
        except (LeaseConflict, LeaseUnavailable) as exc:
            log.warning("could not take the handed-over Lease: %s", exc)
            return
        log.info("took the handed-over Lease: primary for term %d", written.term)
        self._became_primary(written, sent)

    async def hand_over(self, target: str, url: str) -> LeaseRecord:
        """Name ``target`` holder, by CAS, under ``term + 1`` and step down: the last
        step of a switchover, once ``target`` holds everything this primary wrote
        and this primary writes nothing more (``switchover.py``).

        The in-sync set loses ``target`` (now the holder) and gains this replica,
        which holds exactly what ``target`` does. A 409 caused by our own renewal
        is retried on the fresh record; LeaseConflict when the Lease is no longer
        ours to give, LeaseUnavailable when the API could not be asked (the
        caller must then find out whether the write happened).
        """
        me = self.config.name
        record = self.record
        for _ in range(3):
            if not self.is_primary or record is None or record.holder != me:
                raise LeaseConflict("this replica no longer holds the Lease")
            if record.term != self.state.term or target not in record.in_sync:
                raise LeaseConflict(f"{target} is not in the in-sync set of term {record.term}")
            now = micro_time()
            new = replace(
                record,
                holder=target,
                term=record.term + 1,
                primary_url=url,
                renew_time=now,
                acquire_time=now,
                transitions=record.transitions + 1,
                in_sync=sorted({*record.in_sync, me} - {target}),
                eligible=sorted(set(record.eligible) - {target, me}),
                positions=self._positions(record),
                began="switchover",
            )
            try:
                written = await self.client.replace(new)
            except LeaseConflict:
                record = await self.client.get()
                if record is not None:
                    self._observe(record, self.clock())
                continue
            self._observe(written, self.clock())
            log.info("handed the Lease over to %s: term %d", target, written.term)
            await self._demote(written.term, written.primary_url)
            await self._follow(written)
            return written
        raise LeaseConflict("the Lease kept changing under the switchover")

    async def step_down(self, record: LeaseRecord | None = None) -> None:
        """Stop being primary without a Lease write (always safe): follow ``record``
        when given, else let the next round take the Lease back (under a new term)
        or follow whoever holds it."""
        if record is not None:
            self._observe(record, self.clock())
            if self.is_primary:
                await self._demote(record.term, record.primary_url or None)
            await self._follow(record)
        elif self.is_primary:
            await self._demote(self.state.term, None)

    def _became_primary(self, written: LeaseRecord, sent: float) -> None:
        """``sent``: our clock when the write that made us holder was sent (the Lease
        runs from no earlier than that for anyone)."""
        self._observe(written, self.clock())
        self._renewed_at = sent
        self._gave_up_at = None
        s = self.state
        s.role, s.term, s.primary_url = "primary", written.term, written.primary_url
        s.holder, s.in_sync = written.holder, list(written.in_sync)
        s.eligible = list(written.eligible)
        self._changed()

    async def _renew(self, record: LeaseRecord, now: float) -> None:
        sent = self.clock()
        try:
            written = await self._write_renewal(record)
        except LeaseConflict as exc:
            # Most often our own in-sync change won the race: try again at once on the
            # fresh version, rather than a retry period later (under load that wait
            # alone can reach the renew deadline and stop acknowledgements).
            fresh = await self._reread()
            if fresh is not None and (
                fresh.holder != self.config.name or fresh.term != record.term
            ):
                await self._follow(fresh)  # deposed: the Lease says so, whatever our clock
                return
            if fresh is None:
                log.warning("could not renew the Lease: %s", exc)
                await self._check_deadline()
                return
            sent = self.clock()
            try:
                written = await self._write_renewal(fresh)
            except (LeaseConflict, LeaseUnavailable) as again:
                log.warning("could not renew the Lease: %s", again)
                await self._check_deadline()
                return
        except LeaseUnavailable as exc:
            # Perhaps written, perhaps not: either way the deadline runs from the last
            # renewal we know of, which is the safe side.
            log.warning("could not renew the Lease: %s", exc)
            await self._check_deadline()
            return
        self._observe(written, self.clock())
        self._renewed_at = sent
        self.state.in_sync = list(written.in_sync)
        self.state.eligible = list(written.eligible)

    async def _release(self, record: LeaseRecord, reason: str) -> None:
        """Give the Lease up at once (an empty holder, the term kept), so that an in-sync
        standby takes it in its next round, under a new term, rather than after the
        Lease's duration. Only in-sync replicas are eligible, so nothing acknowledged
        is lost; this replica stops being primary first, whatever the CAS gives."""
        if self.is_primary:
            log.error("storage failed closed (%s): giving up the Lease", reason)
            await self._demote(self.state.term, None)
        await self._vacate(record, set(record.eligible) - {self.config.name})

    async def _vacate(self, record: LeaseRecord, eligible: set[str]) -> None:
        """One CAS that empties the holder and keeps the term, so that an eligible
        replica may take the Lease at once; lost or refused, the Lease runs out (or
        the next round writes it again) instead."""
        new = replace(
            record,
            holder="",
            primary_url="",
            eligible=sorted(eligible),
            positions=self._positions(record),
        )
        try:
            written = await self.client.replace(new)
        except (LeaseConflict, LeaseUnavailable) as exc:
            log.warning("could not give up the Lease: %s", exc)
            return
        self._observe(written, self.clock())

    def _positions(self, record: LeaseRecord) -> dict[str, Position]:
        """The Lease's positions with the standbys' as last fetched and ours now (what a
        cold start chooses by), written with every change a primary makes."""
        return {**record.positions, **self.reported(), self.config.name: self.position()}

    async def _write_renewal(self, record: LeaseRecord) -> LeaseRecord:
        return await self.client.replace(
            replace(
                record,
                renew_time=micro_time(),
                positions=self._positions(record),
                set_id=await self._set_id(record),  # a Lease from before set ids gets ours
            )
        )

    async def _creating(self) -> str | None:
        """The set id to create the Lease with, or None when this replica may not
        create it: empty storage, and another replica is the set's bootstrap one
        (identity.py). A directory with data, or the bootstrap replica, mints an id
        (written to the directory first) when it has none."""
        if self.identity is None:
            return ""
        if (why := self.identity.may_create()) is not None:
            self.identity.wait(why)
            return None
        return await self.identity.settle("")

    async def _set_id(self, record: LeaseRecord) -> str:
        """The set id to write into the Lease: the Lease's own (this replica's data
        directory then holds it: ``_eligible`` let only such a replica get here), or,
        in a Lease written before set ids, this directory's."""
        if self.identity is None:
            return record.set_id
        return await self.identity.settle(record.set_id)

    async def _reread(self) -> LeaseRecord | None:
        try:
            record = await self.client.get()
        except LeaseUnavailable:
            return None
        if record is not None:
            self._observe(record, self.clock())
        return record

    async def _check_deadline(self) -> None:
        """A primary that has not renewed for the renew deadline stops acknowledging."""
        if self.is_primary and self.clock() - self._renewed_at >= self.config.renew_deadline:
            log.error(
                "no Lease renewal for %.1fs: stepping down to standby", self.config.renew_deadline
            )
            await self._demote(self.state.term, None)

    async def _follow(self, record: LeaseRecord) -> None:
        if self.is_primary:
            log.error(
                "the Lease is held by %r (term %d): stepping down", record.holder, record.term
            )
            await self._demote(record.term, record.primary_url or None)
        s = self.state
        if (s.term, s.primary_url, s.holder, s.in_sync, s.eligible) != (
            record.term,
            record.primary_url or None,
            record.holder,
            record.in_sync,
            record.eligible,
        ):
            s.term, s.primary_url = record.term, record.primary_url or None
            s.holder, s.in_sync = record.holder, list(record.in_sync)
            s.eligible = list(record.eligible)
            self._changed()

    async def _demote(self, term: int, primary: str | None) -> None:
        s = self.state
        s.role, s.term, s.primary_url = "standby", term, primary
        self._changed()
        if self.on_demoted is not None:
            done = self.on_demoted()
            if done is not None:
                await done

    async def change_in_sync(self, names: list[str], eligible: list[str] | None = None) -> bool:
        """Write a new in-sync set (and eligible set) by CAS; True only once it is in
        the Lease (a standby's acknowledgements count, and a removed one's stop
        mattering, only then). A write whose answer was lost is settled by reading
        the Lease back first (``_settle``): until then the caller keeps waiting for
        both the old and the new members."""
        record = self.record
        if not self.is_primary or record is None or record.holder != self.config.name:
            return False
        new = replace(
            record,
            in_sync=sorted(names),
            eligible=sorted(record.eligible if eligible is None else eligible),
        )
        try:
            written = await self.client.replace(new)
        except LeaseConflict as exc:
            log.warning("could not change the in-sync set: %s", exc)
            fresh = await self._reread()
            if fresh is not None and (
                fresh.holder != self.config.name or fresh.term != self.state.term
            ):
                await self._follow(fresh)  # deposed: step down now, not at the deadline
            return False
        except LeaseUnavailable as exc:
            log.warning("the in-sync change's answer was lost (%s): reading the Lease back", exc)
            settled = await self._settle(new)
            if settled is None:
                return False
            written = settled
        self._observe(written, self.clock())
        self.state.in_sync = list(written.in_sync)
        self.state.eligible = list(written.eligible)
        self._changed()
        return True

    async def _settle(self, new: LeaseRecord) -> LeaseRecord | None:
        """Whether ``new``, written with an answer that never came, is in the Lease:
        the record if it is, None if it is not and never will be.

        Read back until it is known. Our change is there: written. The version it
        was written against is still there: the write may yet arrive, so renew at
        that version first (a CAS: the late write can then only fail), and it was
        not written. Any other version: not written, for a CAS against an older
        version can never succeed (resourceVersions are never reused). Gives up
        (None) once this replica may no longer acknowledge: it then stops being
        primary, which is safe whatever the Lease says.
        """
        while self.may_acknowledge:
            try:
                record = await self.client.get()
            except LeaseUnavailable as exc:
                log.warning("cannot read the Lease back: %s", exc)
                await asyncio.sleep(self.config.retry_period / 4)
                continue
            if record is None:
                return None
            self._observe(record, self.clock())
            if record.holder != self.config.name or record.term != new.term:
                await self._follow(record)
                return None
            if record.version == new.version:
                sent = self.clock()
                try:
                    renewed = await self._write_renewal(record)
                except (LeaseConflict, LeaseUnavailable):
                    continue  # something landed, perhaps ours: read again
                self._observe(renewed, self.clock())
                self._renewed_at = sent
                return None
            if (record.in_sync, record.eligible) == (new.in_sync, new.eligible):
                return record
            return None
        return None

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

    async def give_up(self, reason: str) -> None:
        """Hand the Lease to whoever can form a quorum: an empty holder, the term kept,
        and this replica added to the eligible set (it holds every write it
        acknowledged). For a primary with too few standbys in sync for too long
        while others are eligible: cut off from its standbys but not from the
        API, it would otherwise refuse every write for as long as the cut lasts.
        It does not take the Lease back for a lease duration, so the others go
        first; safe whatever the CAS gives, since it stops being primary first."""
        record = self.record
        if not self.is_primary or record is None or record.holder != self.config.name:
            return
        log.error("giving up the Lease: %s", reason)
        self._gave_up_at = self.clock()
        await self._demote(self.state.term, None)
        await self._vacate(record, {*record.eligible, self.config.name})

    def _changed(self) -> None:
        self.state.changed.set()
        self.state.changed = asyncio.Event()
