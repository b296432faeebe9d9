"""Mutants: the replica set's rules broken on purpose, each of which the simulation
must catch (a simulator that passes a broken rule proves nothing about the
real one).

Each swaps one rule of the server's own code for the run's duration, inside
the simulating process: a pure function of ``replication/rules.py``, or a
method of the class that holds the rule. Nothing in the server knows of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from stream_server.replication import rules
from stream_server.replication.lease.kube_lease import LeaseRecord
from stream_server.replication.lease.lease_writes import LeaseWrites
from stream_server.replication.lease.role_state import RoleBase
from stream_server.replication.standby.freshness import NS, Freshness


def _commit_one_short(held: int, members: Iterable[int]) -> int:
    """The commit point over every member but the one furthest behind."""
    return min([held, *sorted(members)[1:]])


def _ack_before_flush(durable: rules.Position, received: rules.Position) -> rules.Position:
    """A standby acknowledges frames it has received, flushed or not."""
    return max(durable, received)


async def _settle_unread(self: LeaseWrites, new: LeaseRecord) -> tuple[LeaseRecord, int] | None:
    """A Lease write whose answer was lost is taken as written, never read back."""
    return new, self._sending()


def _fresh_past_bound(self: Freshness) -> float:
    """Reads stay up to date for four times the staleness bound."""
    if not self.current_at:
        return 0.0
    return max(0.0, (self.current_at + 4 * self._bound_ns - self.clock()) / NS)


def _span_of_the_lease(lease_duration: float, renew_deadline: float) -> float:
    """A primary acknowledges and answers reads for the whole lease after a renewal, as
    if every clock ran at its rate: no margin for drift (only drift catches it)."""
    return lease_duration


def _primary_fresh_unclocked(self: RoleBase) -> float:
    """A primary's reads are current while it is primary: its renew deadline is left to
    its watchdog and rounds, not read off its clock at each read, so a primary that
    slept past it answers the reads that waited for it before the watchdog wakes (only
    a pause catches it)."""
    return self.deadline if self.is_primary else 0.0


_heard = Freshness.heard


def _heard_on_arrival(self: Freshness, stamp: int, commit: int, visible: int) -> None:
    """A standby is current as of when an echo reaches it, not as of the stamp echoed: an
    answer that waited through a pause makes it current again on waking (only a pause
    catches it, but for a slow message now and then)."""
    _heard(self, self.clock() if stamp else 0, commit, visible)


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    owner: object  # the module or class the rule lives in
    attribute: str
    broken: Callable[..., object]


MUTANTS = {
    m.name: m
    for m in (
        Mutant(
            "commit-one-short",
            "the commit point is computed over one member too few",
            rules,
            "commit_point",
            _commit_one_short,
        ),
        Mutant(
            "ack-before-flush",
            "a standby acknowledges frames before its WAL flush",
            rules,
            "acknowledged",
            _ack_before_flush,
        ),
        Mutant(
            "lease-unread",
            "a Lease write whose answer was lost is settled without reading it back",
            LeaseWrites,
            "_settle",
            _settle_unread,
        ),
        Mutant(
            "stale-read",
            "reads are answered up to date past the staleness bound",
            Freshness,
            "fresh_for",
            _fresh_past_bound,
        ),
        Mutant(
            "clock-margin",
            "a primary acknowledges and reads for the whole lease, no margin for clock drift",
            rules,
            "acknowledge_span",
            _span_of_the_lease,
        ),
        Mutant(
            "wake-unchecked",
            "a primary answers reads as current without reading its clock against its deadline",
            RoleBase,
            "acknowledge_for",
            property(_primary_fresh_unclocked),
        ),
        Mutant(
            "fresh-on-arrival",
            "a standby is current as of when its primary's echo arrives, not the stamp echoed",
            Freshness,
            "heard",
            _heard_on_arrival,
        ),
    )
}


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """The mutant ``name`` in place for the block (None: the healthy rules)."""
    if name is None:
        yield
        return
    if name not in MUTANTS:
        raise ValueError(f"no mutant {name!r}; the mutants are {', '.join(MUTANTS)}")
    m = MUTANTS[name]
    healthy = getattr(m.owner, m.attribute)
    setattr(m.owner, m.attribute, m.broken)
    try:
        yield
    finally:
        setattr(m.owner, m.attribute, healthy)
