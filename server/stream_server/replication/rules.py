"""The replica set's safety rules that are plain arithmetic, as pure functions.

The shipper (``shipping.py``) and the follower (``standby/receiver.py``) call these,
and so does the deterministic simulation of a replica set (``testkit/simulate``),
which drives the real primary, standby and Lease logic over a virtual clock:
kept apart from the async classes, each rule is the same code in the server and
in the simulation, and the simulation's mutants (deliberately broken rules it
must catch) replace exactly these functions, never a flag in the server.
"""

from __future__ import annotations

from collections.abc import Iterable

Position = tuple[int, int]  # (term, lsn)


def commit_point(held: int, members: Iterable[int]) -> int:
    """The highest lsn held here (``held``) and by every member the commit point waits
    for (their acknowledged lsns: the in-sync set and the standbys joining it). Each
    of them may be elected next, so a write is committed only once all of them hold
    it; one member fewer and an election could lose an acknowledged write."""
    return min([held, *members])


def acknowledged(durable: Position, received: Position) -> Position:
    """The position a standby tells its primary it holds: the frames its WAL flush made
    durable, never ones it has received but not yet flushed (``received``). The primary
    counts an acknowledgement towards the commit point, so a standby that crashed
    after acknowledging an unflushed frame could be elected without a write the
    primary acknowledged."""
    del received
    return durable


def acknowledge_span(lease_duration: float, renew_deadline: float) -> float:
    """How long after sending its last successful renewal a primary may acknowledge and
    answer reads, by its own clock: the renew deadline, never the whole lease. The
    others may take the Lease over once it has gone unchanged for ``lease_duration``
    by *their* clocks, which need not run at its rate: the gap between the two is the
    margin for clocks whose rates differ by less than ``lease_duration /
    renew_deadline`` (docs/replication.md, "The assumption"). A primary that counted
    the whole lease on a slow clock would still answer as primary after another was
    elected."""
    del lease_duration
    return renew_deadline
