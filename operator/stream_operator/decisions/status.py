"""What the status says, computed from what was observed (never from what was hoped).

Input: the DurableStream's spec and generation, the StatefulSet as the API
returns it (or None), its pods and PVCs, and the outcome of the reconcile
that just ran (or None when only the pods were observed: then the last
outcome stands). Output: the status dict the operator writes.

The StatefulSet's counts say how many servers are ready, not why the others
are not: a server that exits at start (an old image on a newer data format)
or is OOM-killed while it recovers would read as "Progressing" for ever. So
the pods' container states name the reason (CrashLoopBackOff, OOMKilled,
ImagePullBackOff...) with the end of the server's own message, and a pod
whose volume is smaller than the spec asks keeps the resource from Ready.

``observedGeneration`` moves to a generation only once that generation is
applied whole: a refused or failed change leaves it behind, and the
``Accepted`` condition says why.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stream_operator.api import quantities
from stream_operator.api.conditions import condition
from stream_operator.api.spec import DurableStreamSpec, SpecInput, with_defaults
from stream_operator.decisions.plan import short_claims
from stream_operator.decisions.pod_states import PodTrouble, pod_trouble
from stream_operator.decisions.replica_roles import failing_over, lease_view, replica_states
from stream_operator.decisions.rollout import Step
from stream_operator.specs.disruptions import drain_condition


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


APPLIED = "Applied"


@dataclass(frozen=True)
class Outcome:
    """What a reconcile did with the spec: applied whole (reason Applied), or why not.

    Reasons: ChangeRefused (the operator will not do it), ExpansionNotAllowed (the
    StorageClass cannot grow the volumes), ApplyFailed (the API server refused),
    InvalidName (the name cannot be rendered: names.py).
    """

    reason: str = APPLIED
    message: str = "the spec is applied"

    @property
    def applied(self) -> bool:
        return self.reason == APPLIED


def analytics_condition(
    *,
    error: str | None = None,
    spark_operator: bool = True,
    scheduled: Sequence[dict[str, Any]] = (),
    source: str | None = None,
    waiting: str | None = None,
) -> list[dict[str, str]]:
    """The Analytics condition: the renderer's refusal, a missing Spark Operator, a
    replica set's jobs waiting for a standby in sync (``waiting``: why), or the
    ScheduledSparkApplications in place (none when analytics is off); ``source``: the
    standby a replica set's jobs read."""
    if error is not None:
        return [condition("Analytics", False, "InvalidAnalytics", error)]
    if not spark_operator:
        message = "spec.analytics is enabled, but the Spark Operator is not installed"
        return [condition("Analytics", False, "SparkOperatorMissing", message)]
    if waiting is not None:
        return [condition("Analytics", False, "NoStandbyInSync", waiting)]
    if not scheduled:
        return []
    schedule = scheduled[0]["spec"]["schedule"]
    message = f"{len(scheduled)} ScheduledSparkApplication(s), schedule {schedule}"
    if source:
        message += f", reading the volume of {source} (a standby in sync)"
    return [condition("Analytics", True, "Scheduled", message)]


def compute_status(
    *,
    spec: SpecInput,
    generation: int | None,
    statefulset: dict[str, Any] | None,
    endpoint: str,
    outcome: Outcome | None = None,
    previous: dict[str, Any] | None = None,
    extra: Sequence[dict[str, Any]] = (),
    pods: Sequence[dict[str, Any]] = (),
    pvcs: Sequence[dict[str, Any]] = (),
    lease: dict[str, Any] | None = None,
    rollout: Step | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """``extra``: conditions of optional parts (Analytics), decided where they are applied.
    ``pods``, ``pvcs``: the DurableStream's pods and claims, as the API lists them.
    ``lease``: a replica set's Lease as the servers wrote it (None: none yet).
    ``rollout``: the step a replica set's rolling update took this round (rollout.py).
    ``now``: the time the Lease's expiry is judged at (default: now)."""
    s = with_defaults(spec)
    previous = previous or {}
    accepted, observed = _accepted(outcome, generation, previous)
    short = short_claims(pvcs, s.storage.size, s.replicas, quantities.as_bytes)
    if statefulset is None:
        ready, phase = 0, "Pending"
        conditions = [
            condition("Ready", False, "NoStatefulSet", "the StatefulSet has not been created yet"),
            condition("Progressing", True, "Creating", "creating the server StatefulSet"),
            condition("Degraded", False, "NoStatefulSet", "nothing to degrade yet"),
        ]
    else:
        servers = _Servers(statefulset, s.replicas)
        ready = servers.ready
        phase, conditions = _server_conditions(
            servers, s.storage.size, short, accepted, pods, rollout
        )
    replication: dict[str, Any] = {}
    if s.replicated and statefulset is not None:
        phase, conditions, replication = _replica_set_conditions(
            s, phase, conditions, lease, pods, previous, now
        )
    if accepted is not None:
        conditions.append(accepted)
    conditions += list(extra)
    out = {
        **replication,
        "phase": phase,
        "replicas": s.replicas,
        "readyReplicas": ready,
        "endpoint": endpoint,
        "conditions": _stamp(conditions, previous.get("conditions") or []),
    }
    if observed is not None:
        out["observedGeneration"] = observed
    return out


def _accepted(
    outcome: Outcome | None, generation: int | None, previous: dict[str, Any]
) -> tuple[dict[str, str] | None, int | None]:
    """The Accepted condition and observedGeneration: this reconcile's outcome, or (a
    status round, no outcome) what the last one wrote."""
    if outcome is not None:
        accepted = condition("Accepted", outcome.applied, outcome.reason, outcome.message)
        return accepted, generation if outcome.applied else previous.get("observedGeneration")
    kept = next(
        (
            {k: c[k] for k in ("type", "status", "reason", "message") if k in c}
            for c in previous.get("conditions") or []
            if c.get("type") == "Accepted"
        ),
        None,
    )
    return kept, previous.get("observedGeneration")


class _Servers:
    """What the StatefulSet reports of its servers, against the ``want`` replicas."""

    def __init__(self, statefulset: dict[str, Any], want: int) -> None:
        st = statefulset.get("status") or {}
        meta = statefulset.get("metadata") or {}
        self.want = want
        self.ready = int(st.get("readyReplicas") or 0)
        self.updated = int(st.get("updatedReplicas") or 0)
        current = int(st.get("replicas") or 0)
        self.rolling = bool(
            (st.get("observedGeneration") or 0) < (meta.get("generation") or 0)
            or (st.get("updateRevision") and st.get("currentRevision") != st.get("updateRevision"))
            or self.updated < want
            or current != want
        )
        self.all_ready = self.ready >= want and not self.rolling


def _server_conditions(
    servers: _Servers,
    size: str,
    short: dict[str, str],
    accepted: dict[str, str] | None,
    pods: Sequence[dict[str, Any]],
    rollout: Step | None,
) -> tuple[str, list[dict[str, str]]]:
    """The phase and the Ready, Progressing and Degraded conditions from the servers."""
    trouble = None if servers.all_ready else pod_trouble(pods)
    resizing = f"volumes not yet at {size}: " + ", ".join(
        f"{n} holds {held}" for n, held in short.items()
    )
    phase, ready = _ready(servers, accepted, short, resizing, trouble)
    return phase, [
        ready,
        _progressing(servers, short, resizing, rollout),
        _degraded(servers, trouble),
    ]


def _ready(
    servers: _Servers,
    accepted: dict[str, str] | None,
    short: dict[str, str],
    resizing: str,
    trouble: PodTrouble | None,
) -> tuple[str, dict[str, str]]:
    ready, want = servers.ready, servers.want
    if servers.all_ready and accepted is not None and accepted["status"] != "True":
        # The pods serve, but not the spec that was asked for: not Ready.
        return "Degraded", condition("Ready", False, accepted["reason"], accepted["message"])
    if servers.all_ready and short:
        # A new replica's claim comes from the StatefulSet's (immutable) template,
        # and a grown request is a promise until the volume is resized.
        return "Progressing", condition("Ready", False, "StorageResizing", resizing)
    if servers.all_ready:
        return "Ready", condition(
            "Ready", True, "AllReplicasReady", f"{ready}/{want} servers ready"
        )
    if trouble is not None:
        # A server that keeps exiting will not come up by waiting: say why.
        return "Degraded", condition("Ready", False, trouble.reason, trouble.message)
    return (
        "Progressing" if servers.rolling else "Degraded",
        condition("Ready", False, "ReplicasNotReady", f"{ready}/{want} servers ready"),
    )


def _progressing(
    servers: _Servers, short: dict[str, str], resizing: str, rollout: Step | None
) -> dict[str, str]:
    revision = f"{servers.updated}/{servers.want} servers on the current revision"
    if rollout is not None and rollout.rolling:
        return condition("Progressing", True, rollout.reason, rollout.message)
    if servers.rolling:
        return condition("Progressing", True, "RollingUpdate", revision)
    if short:
        return condition("Progressing", True, "StorageResizing", resizing)
    return condition("Progressing", False, "Stable", revision)


def _degraded(servers: _Servers, trouble: PodTrouble | None) -> dict[str, str]:
    if trouble is not None:
        return condition("Degraded", True, trouble.reason, trouble.message)
    degraded = servers.ready < servers.want and not servers.rolling
    return condition(
        "Degraded",
        degraded,
        "PodsNotReady" if degraded else "AsExpected",
        f"{servers.want - servers.ready} server(s) not ready" if degraded else "all servers ready",
    )


def _replica_set_conditions(
    spec: DurableStreamSpec,
    phase: str,
    conditions: list[dict[str, str]],
    lease: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    previous: dict[str, Any],
    now: datetime.datetime | None,
) -> tuple[str, list[dict[str, str]], dict[str, Any]]:
    """A replica set's part: FailingOver, the replication fields, TooFewInSync, Drainable."""
    lost = failing_over(
        lease_view(lease),
        pods,
        had_primary=bool(previous.get("primary")),
        now=now or datetime.datetime.now(datetime.UTC),
    )
    if lost is not None:
        # No replica acknowledges writes until a standby holds the Lease and is ready.
        # A pod's own trouble (CrashLoopBackOff with the server's words) says more.
        phase = "Degraded"
        ready_now = next(c for c in conditions if c["type"] == "Ready")
        if ready_now["reason"] in ("AllReplicasReady", "ReplicasNotReady"):
            conditions = [c for c in conditions if c["type"] != "Ready"]
            conditions.insert(0, condition("Ready", False, *lost))
        conditions.append(condition("FailingOver", True, *lost))
    else:
        holder = lease_view(lease).holder
        conditions.append(
            condition(
                "FailingOver",
                False,
                "PrimaryHoldsLease" if holder else "NoPrimaryYet",
                f"{holder} holds the Lease" if holder else "no replica holds the Lease yet",
            )
        )
    replication, too_few = _replication_status(spec, lease, pods)
    if too_few is not None and not any(
        c["type"] == "Degraded" and c["status"] == "True" for c in conditions
    ):
        conditions = [c for c in conditions if c["type"] != "Degraded"]
        conditions.append(condition("Degraded", True, "TooFewInSync", too_few))
    conditions.append(drain_condition(spec))  # whether node drains can move on
    return phase, conditions, replication


def _replication_status(
    spec: DurableStreamSpec, lease: dict[str, Any] | None, pods: Sequence[dict[str, Any]]
) -> tuple[dict[str, Any], str | None]:
    """A replica set's primary, term and per-replica roles from its Lease, and why it is
    degraded (fewer in sync than ``minInSync``: with ``required`` durability no write is
    acknowledged), or None."""
    view = lease_view(lease)
    states = replica_states(view, pods)
    synced = len(view.synced)
    want = spec.min_in_sync
    fields: dict[str, Any] = {
        "primary": view.holder,
        "term": view.term,
        "inSyncReplicas": synced,
        "replicaStatus": states,
    }
    if view.began:
        fields["termBegan"] = view.began
    if synced >= want:
        return fields, None
    who = view.holder or "no primary elected yet"
    return fields, f"{synced} replica(s) in sync ({who}), minInSync is {want}"


def same_status(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether writing ``new`` would change what ``old`` says (transition times aside)."""

    def essence(status: dict[str, Any]) -> tuple[str, list[tuple[Any, ...]]]:
        rest = {k: v for k, v in status.items() if k != "conditions"}
        conds = sorted(
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
            for c in status.get("conditions") or []
        )
        return json.dumps(rest, sort_keys=True), conds

    return essence(new) == essence({k: v for k, v in old.items() if k in new})


def _stamp(
    conditions: list[dict[str, str]], previous: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Keep lastTransitionTime unless the condition's status changed."""
    before = {c.get("type"): c for c in previous}
    out = []
    for c in conditions:
        old = before.get(c["type"])
        stamp = old.get("lastTransitionTime") if old and old.get("status") == c["status"] else None
        out.append({**c, "lastTransitionTime": stamp or _now()})
    return out
