"""A replica set's roles as its Lease says them: who is primary, in which term, who is in sync.

The servers elect their primary themselves (docs/replication.md); the operator
only reads the Lease they write and reflects it: the role label on each pod
(which the client Services select on) and the status. Pure functions over the
Lease and the pods as the API returns them.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_operator import GROUP

# The annotations the servers write on their Lease (stream_server.replication.lease.kube_lease).
TERM = f"{GROUP}/term"
IN_SYNC = f"{GROUP}/in-sync"
POSITIONS = f"{GROUP}/positions"
TERM_BEGAN = f"{GROUP}/term-began"  # "switchover" (handed over) or "election"


@dataclass(frozen=True)
class LeaseView:
    """What the operator reads from the Lease: holder, term, in-sync set, positions."""

    holder: str = ""
    term: int = 0
    in_sync: tuple[str, ...] = ()
    positions: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    renewed: datetime.datetime | None = None  # spec.renewTime: the holder's last renewal
    duration: int = 0  # spec.leaseDurationSeconds: how long a renewal holds
    began: str = ""  # how the term began: "switchover" (handed over) or "election"

    def expired(self, now: datetime.datetime) -> bool:
        """Whether the holder has not renewed within the Lease's duration: a standby may
        take it (and the holder stopped acknowledging writes at its renew deadline)."""
        if not self.holder or self.renewed is None or self.duration <= 0:
            return False
        return now > self.renewed + datetime.timedelta(seconds=self.duration)

    @property
    def synced(self) -> frozenset[str]:
        """The replicas holding every acknowledged write: the Lease's in-sync list names
        the standbys only; the holder is in sync by definition."""
        return frozenset({self.holder, *self.in_sync} - {""})


def _json(raw: str | None, kind: type) -> Any:
    """A hand-edited or half-written annotation reads as empty, never as an error."""
    try:
        value = json.loads(raw or "")
    except ValueError:
        return kind()
    return value if isinstance(value, kind) else kind()


def lease_view(lease: Mapping[str, Any] | None) -> LeaseView:
    if not lease:
        return LeaseView()
    notes = (lease.get("metadata") or {}).get("annotations") or {}
    try:
        term = int(notes.get(TERM) or 0)
    except ValueError:
        term = 0
    positions = {
        str(k): (int(v[0]), int(v[1]))
        for k, v in _json(notes.get(POSITIONS), dict).items()
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)
    }
    spec = lease.get("spec") or {}
    try:
        duration = int(spec.get("leaseDurationSeconds") or 0)
    except (TypeError, ValueError):
        duration = 0
    return LeaseView(
        holder=str(spec.get("holderIdentity") or ""),
        term=term,
        in_sync=tuple(str(n) for n in _json(notes.get(IN_SYNC), list)),
        positions=positions,
        renewed=_micro_time(spec.get("renewTime")),
        duration=duration,
        began=str(notes.get(TERM_BEGAN) or ""),
    )


def _micro_time(raw: Any) -> datetime.datetime | None:
    """A MicroTime (``2026-11-23T15:14:39.123456Z``); unreadable reads as never renewed."""
    if not raw:
        return None
    try:
        when = datetime.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The kubelet's verdict: the pod's Ready condition (or, lacking it, its server
    container's ``ready``); a pod being deleted is not ready."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return any(cs.get("ready") for cs in status.get("containerStatuses") or [])


# The reasons of the FailingOver condition while it is True.
PRIMARY_LOST = "PrimaryLost"
LEASE_EXPIRED = "LeaseExpired"


def failing_over(
    view: LeaseView,
    pods: Sequence[Mapping[str, Any]],
    *,
    had_primary: bool,
    now: datetime.datetime,
) -> tuple[str, str] | None:
    """Why the replica set is between two primaries, as (reason, message), or None.

    From the moment the Lease's holder is seen gone (its pod deleted or not ready) or its
    Lease expired (a frozen or partitioned primary), until a holder whose pod is ready
    holds a live Lease. ``had_primary``: the status named a primary before; the first
    election of a new set is not a failover.
    """
    if not had_primary or not view.holder or not pods:
        return None  # no pods listed: nothing to judge (the Ready condition says why)
    pod = next((p for p in pods if pod_name(p) == view.holder), None)
    if pod is None:
        return PRIMARY_LOST, (
            f"the primary {view.holder}'s pod is gone; an in-sync standby takes the Lease "
            "once it expires"
        )
    if not pod_ready(pod):
        return PRIMARY_LOST, (
            f"the primary {view.holder}'s pod is not ready; an in-sync standby takes the "
            "Lease once it expires"
        )
    if view.expired(now):
        return LEASE_EXPIRED, (
            f"the primary {view.holder} has not renewed its Lease for more than "
            f"{view.duration} s; an in-sync standby takes it over"
        )
    return None


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def wanted_roles(view: LeaseView, pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The role each pod should be labelled with: the Lease holder ``primary``, every
    other pod ``standby`` (a pod named by no Lease yet, too: it is not the primary)."""
    return {
        pod_name(p): "primary" if pod_name(p) == view.holder else "standby"
        for p in pods
        if pod_name(p)
    }


def in_sync_condition(pod: Mapping[str, Any], kind: str) -> bool | None:
    """The pod's condition of type ``kind`` (None: it has none)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return bool(cond.get("status") == "True")
    return None


def in_sync_changes(
    view: LeaseView, pods: Sequence[Mapping[str, Any]], kind: str
) -> list[tuple[str, bool]]:
    """The (pod, in sync) conditions of type ``kind`` to write so that each pod's says what
    the Lease does: True on the holder and each in-sync standby, False on the others;
    only those that differ (or are missing), so a round with nothing new writes nothing.
    With no holder nothing is decided (the servers have not elected one yet)."""
    if not view.holder:
        return []
    out = []
    for pod in pods:
        name = pod_name(pod)
        if name and in_sync_condition(pod, kind) != (name in view.synced):
            out.append((name, name in view.synced))
    return sorted(out)


def relabel_order(
    current: Mapping[str, str | None], wanted: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The (pod, role) label changes, demotions first: applied in this order, the primary
    Service never selects two pods, even between two of the patches."""
    changes = [(pod, role) for pod, role in sorted(wanted.items()) if current.get(pod) != role]
    return sorted(changes, key=lambda c: c[1] == "primary")


def replica_states(view: LeaseView, pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each replica's role, in-sync flag, last reported ``[term, lsn]`` position and lag
    (by pod name). The lag is in batches (one lsn per group commit) behind the
    primary's own position, both as the primary last wrote them into the Lease (every
    renewal): the ``durable_streams_replication_lag_*`` metrics give it live, in bytes
    and seconds."""
    head = view.positions.get(view.holder)
    out = []
    for name in sorted(pod_name(p) for p in pods if pod_name(p)):
        entry: dict[str, Any] = {
            "name": name,
            "role": "primary" if name == view.holder else "standby",
            "inSync": name in view.synced,
        }
        if name in view.positions:
            entry["position"] = list(view.positions[name])
            if head is not None:
                entry["lagBatches"] = max(0, head[1] - view.positions[name][1])
        out.append(entry)
    return out


def refused_scale_down(name: str, current: int, wanted: int, view: LeaseView) -> str | None:
    """Why scaling a replica set from ``current`` to ``wanted`` pods must wait, or None.

    The StatefulSet removes the highest ordinals. Removing the primary's pod is an
    unplanned failover, which the user should make on purpose (delete that pod, an
    in-sync standby takes the Lease) before scaling; and one pod left alone in
    single-node mode must hold every acknowledged write, so it must be in sync.
    """
    if wanted >= current or current <= 1:
        return None
    removed = {f"{name}-{i}" for i in range(wanted, current)}
    if view.holder in removed:
        return (
            f"scaling {current} -> {wanted} would remove the primary {view.holder}: "
            f"delete pod {view.holder} first (an in-sync standby takes over), then scale down"
        )
    if wanted == 1 and f"{name}-0" not in view.synced:
        return (
            f"scaling to one replica would leave {name}-0 serving alone, and it is not in "
            "sync (it may lack acknowledged writes): wait until it is"
        )
    return None
