"""Every write this replica makes to the Lease, each a compare-and-swap.

One module just over 400 lines, kept whole: every write is the same compare-and-swap
with the same read-back, and they are read together to see that no two can both win.

Create, renew, acquire, take a hand-over, hand over, release, give up for
want of a quorum, change the in-sync and eligible sets, and settle a write
whose answer was lost: each is one CAS on the Lease's resourceVersion, so two
replicas can never both believe a write of theirs won. A 409 means another
write came first (the next round reads it); a lost answer (a timeout, a cut
connection) may still have happened, and is read back before the primary
acts on either outcome (``_settle``). The state they change is
``role_state.py``'s; the rounds that call them are ``roles.py``'s. The safety
argument is in docs/replication.md.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from stream_server.replication.lease.kube_lease import (
    LeaseConflict,
    LeaseRecord,
    LeaseUnavailable,
    micro_time,
)
from stream_server.replication.lease.role_state import RoleBase

log = logging.getLogger("stream_server.replication")


class LeaseWrites(RoleBase):
    """The Lease writes of a ``RoleLoop``."""

    # Answers to this replica's Lease writes may come back out of order (the API
    # client holds several connections): a renewal's answer that arrives after a newer
    # in-sync change's would put the older in-sync set back, and the primary would stop
    # waiting for a standby the Lease makes electable. Each write that can set the
    # primary's sets is numbered when sent, and only a later-sent one's answer replaces
    # them: a CAS that succeeds was sent after the version it replaced was known, so
    # among our successful writes the order sent is the order written.
    _sets_sent = 0
    _sets_taken = 0

    def _sending(self) -> int:
        self._sets_sent += 1
        return self._sets_sent

    def _take_sets(self, written: LeaseRecord, sent: int) -> None:
        """The in-sync and eligible sets of ``written``, unless a later write's answer
        (or the read a settle made after it) is already in."""
        if sent < self._sets_taken:
            return
        self._sets_taken = sent
        self.state.in_sync = list(written.in_sync)
        self.state.eligible = list(written.eligible)

    async def _create(self, now: float) -> None:
        set_id = await self._creating()
        if set_id is None:
            return
        # Term 1 for new data; above every term the data names for data that came
        # from elsewhere (a restore, a replica cluster, a Lease deleted): terms never
        # go backwards along a history.
        term = self.term_floor() + 1
        record = LeaseRecord(
            holder=self.config.name,
            duration=max(1, round(self.config.lease_duration)),
            renew_time=micro_time(),
            acquire_time=micro_time(),
            term=term,
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
        log.info("created the Lease: primary for term %d", term)
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
            kept=record.kept,  # the operator's owner reference and the like, as read
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
        s.holder = written.holder
        self._take_sets(written, self._sending())  # a new term: no earlier answer counts
        self._changed()

    async def _renew(self, record: LeaseRecord, now: float) -> None:
        sent, number = self.clock(), self._sending()
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
            sent, number = self.clock(), self._sending()
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
        self._renewed_at = max(self._renewed_at, sent)
        self._take_sets(written, number)

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
        number = self._sending()
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
            written, number = settled
        self._observe(written, self.clock())
        self._take_sets(written, number)
        self._changed()
        return True

    async def _settle(self, new: LeaseRecord) -> tuple[LeaseRecord, int] | None:
        """Whether ``new``, written with an answer that never came, is in the Lease:
        the record if it is, None if it is not and never will be.

        Read back until it is known. Our change is there: written (with the number
        of the read that found it, for ``_take_sets``). The version it
        was written against is still there: the write may yet arrive, so renew at
        that version first (a CAS: the late write can then only fail), and it was
        not written. Any other version: not written, for a CAS against an older
        version can never succeed (resourceVersions are never reused). Gives up
        (None) once this replica may no longer acknowledge: it then stops being
        primary, which is safe whatever the Lease says.
        """
        while self.may_acknowledge:
            number = self._sending()
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
                return record, number
            return None
        return None

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
