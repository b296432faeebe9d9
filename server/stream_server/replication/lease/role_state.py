"""What a replica believes about the Lease, and how it changes on what it reads.

The role loop (``roles.py``) and its Lease writes (``lease_writes.py``) change
one state: the role, term, primary and in-sync set this replica believes
(``RoleState``), when it last saw the Lease change and last renewed it. This
module holds that state and the steps every part takes on it: noting a Lease
read (its version stamps when it changed, by this replica's clock), judging
expiry and eligibility, following a holder and stepping down. Stepping down
never writes the Lease, so it is always safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from stream_server.replication import rules
from stream_server.replication.lease import boottime
from stream_server.replication.lease.kube_lease import (
    LeaseClient,
    LeaseRecord,
    LeaseUnavailable,
    Position,
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


class RoleBase:
    """The state a ``RoleLoop`` runs on, and the steps that change it on a read."""

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
        term_floor: Callable[[], int] = lambda: 0,
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
        # The highest term this replica's data names (``ReplicaHooks.term_floor``): a
        # Lease it creates starts above it.
        self.term_floor = term_floor

    @property
    def is_primary(self) -> bool:
        return self.state.role == "primary"

    @property
    def may_acknowledge(self) -> bool:
        """Primary, and renewed within the renew deadline *now*: checked before every
        acknowledgement, so that a primary paused past its deadline (SIGSTOP, a long
        GC) acknowledges nothing when it wakes, before its next round even runs."""
        return self.is_primary and self.clock() - self._renewed_at < self.deadline

    @property
    def acknowledge_for(self) -> float:
        """Seconds ``may_acknowledge`` stays true without another renewal (0: false)."""
        if not self.is_primary:
            return 0.0
        return max(0.0, self.deadline - (self.clock() - self._renewed_at))

    @property
    def deadline(self) -> float:
        """Seconds after sending a renewal that a primary may acknowledge (``rules.py``)."""
        return rules.acknowledge_span(self.config.lease_duration, self.config.renew_deadline)

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

    async def _reread(self) -> LeaseRecord | None:
        try:
            record = await self.client.get()
        except LeaseUnavailable:
            return None
        if record is not None:
            self._observe(record, self.clock())
        return record

    def _positions(self, record: LeaseRecord) -> dict[str, Position]:
        """The Lease's positions with the standbys' as last acknowledged and ours now (what a
        cold start chooses by), written with every change a primary makes."""
        return {**record.positions, **self.reported(), self.config.name: self.position()}

    async def _check_deadline(self) -> None:
        """A primary that has not renewed for the renew deadline stops acknowledging."""
        if self.is_primary and self.clock() - self._renewed_at >= self.deadline:
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

    def _changed(self) -> None:
        self.state.changed.set()
        self.state.changed = asyncio.Event()
