"""The oracle: what a run must never show, judged after the set converged.

The history checker (``testkit.history.check``) judges the clients' history
against the final stream, the committed log of the primary the set converged
on: no acknowledged write lost, none twice, nothing refused yet present, each
client's writes in its order, no read of data later rolled back, no read said
up to date that missed a write acknowledged more than the staleness bound
before it, no acknowledgement from a deposed primary. The staleness bound is
measured by the reader's own clock (docs/replication.md: a clock at rate r
measures the bound B as B / r), so the bound judged is B over the slowest rate
a clock ran at. The simulation sees more than a test against processes can,
and checks it too: a read a primary answered as up to date misses no write
acknowledged before it was sent (a primary is current while it may
acknowledge: no other can have acknowledged anything; a deposed primary that
still answers, because its clock ran slow or it slept through its renew
deadline, is caught here well inside B); at every
acknowledgement, every replica the Lease makes electable holds the write
durably (``World.acknowledged``); when a Lease write names a new term's holder,
no other member may still acknowledge by its own clock (``World.lease_written``); one holder per term in every Lease write, one member acknowledging writes per term, the logs
agreeing wherever two hold a frame of the same term and lsn, and a primary at
the end (the set recovers once the faults stop).
"""

from __future__ import annotations

from dataclasses import asdict

from testkit.history import History, check
from testkit.simulate.workload import PRIMARY
from testkit.simulate.world import World


def final_stream(world: World) -> bytes | None:
    """The committed log of the primary the set converged on (None: no primary)."""
    for member in world.members.values():
        if member.up and member.primary and member.roles.may_acknowledge:
            return member.storage.content(min(member.shipper.committed, member.storage.lsn))
    return None


def violations(world: World, bound: float) -> list[str]:
    found = [f"internal error: {e.strip().splitlines()[-1]}" for e in world.errors]
    found += [f"broken while running: {b}" for b in world.broken[:1]]
    final = final_stream(world)
    if final is None:
        found.append("no primary after the faults healed")
        final = max((m.storage.content(m.storage.lsn) for m in world.members.values()), key=len)
    slowest = min(m.host.slowest for m in world.members.values())
    report = check(world.history, {"s": final}, bound=bound / slowest)
    for kind, items in asdict(report).items():
        if isinstance(items, list) and items:
            found.append(f"{kind} ({len(items)}): {items[0]}")
    found += _primary_reads(world, final) + _terms(world) + _log_matching(world)
    return found


def _primary_reads(world: World, final: bytes) -> list[str]:
    """Reads a primary answered as up to date that miss a write acknowledged before
    they were sent (module doc): the history's staleness check with no bound, on
    those reads alone."""
    reads = History()
    reads.ops = [
        op
        for op in world.history.ops
        if op.kind == "append" or (op.kind == "read" and op.detail == PRIMARY)
    ]
    stale = check(reads, {"s": final}, bound=0.0).stale_reads
    return [f"stale primary reads ({len(stale)}): {stale[0]}"] if stale else []


def _terms(world: World) -> list[str]:
    found = []
    holders: dict[int, set[str]] = {}
    for _, term, holder, _, _ in world.lease.writes:
        if holder:
            holders.setdefault(term, set()).add(holder)
    acks: dict[int, set[str]] = {}
    for op in world.history.ops:
        if op.kind == "append" and op.outcome == "ok" and op.term is not None:
            acks.setdefault(op.term, set()).add(op.server)
    for term, names in sorted(holders.items()):
        if len(names) > 1:
            found.append(f"two holders of term {term} in the Lease: {sorted(names)}")
    for term, names in sorted(acks.items()):
        if len(names) > 1:
            found.append(f"two primaries acknowledged writes in term {term}: {sorted(names)}")
    return found


def _log_matching(world: World) -> list[str]:
    seen: dict[tuple[int, int], tuple[str, bytes]] = {}
    for member in world.members.values():
        for term, lsn, frame in member.storage.frames[: member.storage.flushed]:
            other = seen.setdefault((term, lsn), (member.name, frame))
            if other[1] != frame:
                return [f"{member.name} and {other[0]} hold different frames at {(term, lsn)}"]
    return []
