"""The role loop: who is primary, decided only by CAS writes on the Lease.

Over 400 lines because every write to the Lease (create, renew, acquire, take a
hand-over, hand over, release, change the in-sync set) is here, next to the state
they change: the safety argument reads one module.

Every ``lease_retry_period`` a replica reads the Lease and

- creates it with itself as holder and term 1 when there is none (the
  creation is itself a CAS: 409 to every other creator);
- renews it when it holds it, and steps down when no renewal has succeeded
  for ``lease_renew_deadline`` (shorter than the lease, so it stops
  acknowledging before anyone else may take over);
- takes it, with ``term + 1`` and an empty in-sync set, when it has expired
  and this replica is eligible: a member of the in-sync set or the old
  holder, which are the replicas that hold every acknowledged write;
- takes it at the term it names, by a renewal, when the primary handed it
  over (a switchover, ``hand_over``): it names this replica under a term
  newer than any this process has followed, so nobody has written under it.

Expiry is judged, as client-go's leader election does, from when *this*
replica last saw the Lease change (its resourceVersion), by its own
monotonic clock: the replicas' clocks need not agree. At a cold start an
eligible replica whose reported position is behind another eligible one's
waits one more lease duration, so that the most advanced replica wins when
it is alive. The safety argument is in docs/replication.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from stream_server.replication.lease import (
    LeaseClient,
    LeaseConflict,
    LeaseRecord,
    LeaseUnavailable,
    Position,
    micro_time,
)

log = logging.getLogger("stream_server.replication")

Role = Literal["primary", "standby"]


@dataclass
class RoleConfig:
    name: str
    url: str
    lease_duration: float
    renew_deadline: float
    retry_period: float


@dataclass
class RoleState:
    """What this replica believes now; replaced field by field on the event loop."""

    role: Role = "standby"
    term: int = 0
    primary_url: str | None = None
    holder: str = ""
    in_sync: list[str] = field(default_factory=list)
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
        clock: Callable[[], float] = time.monotonic,
        failed: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.client = client
        self.config = config
        self.position = position
        self.on_demoted = on_demoted
        self.clock = clock
        self.failed = failed
        self.state = RoleState()
        self.record: LeaseRecord | None = None  # as last read or written
        self._seen_version = ""
        self._seen_at = 0.0  # our clock when the Lease last changed (or we first saw it)
        self._renewed_at = 0.0  # our clock when our last renewal succeeded
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # The standbys' positions as the primary last saw them, written with each
        # renewal for a cold start's choice.
        self.reported: Callable[[], dict[str, Position]] = dict

    # ---------------------------------------------------------------- running

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="replication role loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.client.close()

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
        now = self.clock()
        try:
            record = await self.client.get()
        except LeaseUnavailable as exc:
            log.warning("cannot read the Lease: %s", exc)
            await self._check_deadline()
            return
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
        return (
            me in record.in_sync or me == record.holder or (not record.holder and not record.term)
        )

    def _behind(self, record: LeaseRecord) -> bool:
        """Another eligible replica reported a more advanced position than ours."""
        mine = self.position()
        others = [record.holder, *record.in_sync]
        return any(record.positions.get(n, (0, 0)) > mine for n in others if n != self.config.name)

    async def _create(self, now: float) -> None:
        record = LeaseRecord(
            holder=self.config.name,
            duration=max(1, round(self.config.lease_duration)),
            renew_time=micro_time(),
            acquire_time=micro_time(),
            term=1,
            primary_url=self.config.url,
            positions={self.config.name: self.position()},
            began="election",
        )
        try:
            written = await self.client.create(record)
        except LeaseConflict:
            return  # another replica was first: the next round follows it
        except LeaseUnavailable as exc:
            log.warning("cannot create the Lease: %s", exc)
            return
        log.info("created the Lease: primary for term 1")
        self._became_primary(written, now)

    async def _acquire(self, record: LeaseRecord, now: float) -> None:
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
            began="election",
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
        self._became_primary(written, now)

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
        try:
            written = await self.client.replace(new)
        except (LeaseConflict, LeaseUnavailable) as exc:
            log.warning("could not take the handed-over Lease: %s", exc)
            return
        log.info("took the handed-over Lease: primary for term %d", written.term)
        self._became_primary(written, now)

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

    def _became_primary(self, written: LeaseRecord, now: float) -> None:
        self._observe(written, now)
        self._renewed_at = now
        s = self.state
        s.role, s.term, s.primary_url = "primary", written.term, written.primary_url
        s.holder, s.in_sync = written.holder, list(written.in_sync)
        self._changed()

    async def _renew(self, record: LeaseRecord, now: float) -> None:
        try:
            written = await self._write_renewal(record)
        except LeaseConflict as exc:
            # Most often our own in-sync change won the race: try again at once on the
            # fresh version, rather than a retry period later (under load that wait
            # alone can reach the renew deadline and stop acknowledgements).
            fresh = await self._reread()
            if fresh is None or fresh.holder != self.config.name or fresh.term != record.term:
                log.warning("could not renew the Lease: %s", exc)
                await self._check_deadline()
                return
            try:
                written = await self._write_renewal(fresh)
            except (LeaseConflict, LeaseUnavailable) as again:
                log.warning("could not renew the Lease: %s", again)
                await self._check_deadline()
                return
        except LeaseUnavailable as exc:
            log.warning("could not renew the Lease: %s", exc)
            await self._check_deadline()
            return
        self._observe(written, now)
        self._renewed_at = now
        self.state.in_sync = list(written.in_sync)

    async def _release(self, record: LeaseRecord, reason: str) -> None:
        """Give the Lease up at once (an empty holder, the term kept), so that an in-sync
        standby takes it in its next round, under a new term, rather than after the
        Lease's duration. Only in-sync replicas are eligible, so nothing acknowledged
        is lost; this replica stops being primary first, whatever the CAS gives."""
        if self.is_primary:
            log.error("storage failed closed (%s): giving up the Lease", reason)
            await self._demote(self.state.term, None)
        new = replace(
            record,
            holder="",
            primary_url="",
            positions=self._positions(record),
        )
        try:
            written = await self.client.replace(new)
        except (LeaseConflict, LeaseUnavailable) as exc:
            log.warning("could not give up the Lease (the next round tries again): %s", exc)
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
            )
        )

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
        if (s.term, s.primary_url, s.holder, s.in_sync) != (
            record.term,
            record.primary_url or None,
            record.holder,
            record.in_sync,
        ):
            s.term, s.primary_url = record.term, record.primary_url or None
            s.holder, s.in_sync = record.holder, list(record.in_sync)
            self._changed()

    async def _demote(self, term: int, primary: str | None) -> None:
        s = self.state
        s.role, s.term, s.primary_url = "standby", term, primary
        self._changed()
        if self.on_demoted is not None:
            done = self.on_demoted()
            if done is not None:
                await done

    async def change_in_sync(self, names: list[str]) -> bool:
        """Write a new in-sync set by CAS; True only once it is in the Lease (a standby's
        acknowledgements count, and a removed one's stop mattering, only then)."""
        record = self.record
        if not self.is_primary or record is None or record.holder != self.config.name:
            return False
        new = replace(record, in_sync=sorted(names))
        try:
            written = await self.client.replace(new)
        except (LeaseConflict, LeaseUnavailable) as exc:
            log.warning("could not change the in-sync set: %s", exc)
            return False
        self._observe(written, self.clock())
        self.state.in_sync = list(written.in_sync)
        self._changed()
        return True

    def _changed(self) -> None:
        self.state.changed.set()
        self.state.changed = asyncio.Event()
