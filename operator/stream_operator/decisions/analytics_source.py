"""Which volume a replica set's Spark jobs read: one standby's, in sync, never the primary's.

Every replica of a replica set holds the same streams, so one copy is enough,
and it must not be the primary's: a job's reads (and, with ``coschedule``, its
driver and executors on the primary's node) would compete with the writes.
A standby in the Lease's in-sync set holds every acknowledged write. The
choice is sticky: the standby the jobs already read stays while it is an
in-sync standby, so a job is not moved (and its run history not lost) for
nothing. With no standby in sync the jobs wait (suspended, on the volume they
had), and the Analytics condition says why. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stream_operator.decisions.replica_roles import LeaseView


@dataclass(frozen=True)
class Source:
    """The ordinal whose volume the jobs read (None: none to read yet), and, when they
    must wait, why."""

    replica: int | None
    waiting: str | None = None


def choose_source(name: str, replicas: int, view: LeaseView, current: Iterable[int]) -> Source:
    """The standby the jobs read. ``current``: the ordinals the jobs read now."""
    in_sync = [
        i for i in range(replicas) if (pod := f"{name}-{i}") in view.synced and pod != view.holder
    ]
    now = sorted(set(current))
    for i in now:
        if i in in_sync:
            return Source(i)
    if in_sync:
        return Source(in_sync[0])
    who = view.holder or "no primary yet"
    why = (
        f"no standby is in sync ({who} holds the Lease): the jobs wait, so that they read "
        "every acknowledged write and never the primary's volume"
    )
    # Held (suspended) where they are, even on a volume that is now the primary's.
    return Source(now[0] if now else None, why)
