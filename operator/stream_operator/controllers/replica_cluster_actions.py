"""Promotion and demotion carried out (replica_cluster.py decides): what is read for a
decision, the spec the pods are rendered from, the claims a rebuild deletes, the Events.

Called by a reconcile (``step`` before rendering, ``rendered`` on the StatefulSet,
``rebuild`` for the claims) and by every status round (``conditions``, ``tell``), so a
demotion moves on without a spec change: while the StatefulSet is held at 0 pods the
status round converges (``lifecycle.wants_converge``), and each converge takes the next
step once the pods, then the claims, are gone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubernetes import client

from stream_operator.api.spec import DurableStreamSpec
from stream_operator.decisions.replica_cluster import (
    CONDITION,
    FOLLOWER,
    ROLE,
    WRITER,
    Seen,
    Step,
    decide,
    previous_reason,
    refused,
    rolled_out,
    step_events,
    wanted,
)
from stream_operator.kube import events
from stream_operator.kube.apply import delete_pvcs, instance_pods, instance_pvcs, read


def recorded_role(ac: client.ApiClient, sts: dict[str, Any] | None) -> str | None:
    """What the StatefulSet's pods were rendered as (None: no StatefulSet). A StatefulSet
    rendered before the record existed is read from its ConfigMap's follow setting."""
    if sts is None:
        return None
    meta = sts["metadata"]
    role = (meta.get("annotations") or {}).get(ROLE)
    if role in (FOLLOWER, WRITER):
        return str(role)
    cm = read(ac, "ConfigMap", meta["namespace"], f"{meta['name']}-config") or {}
    return FOLLOWER if (cm.get("data") or {}).get("DS_ARCHIVE_FOLLOW") == "true" else WRITER


def step(
    ac: client.ApiClient,
    ds: dict[str, Any],
    spec: DurableStreamSpec,
    sts: dict[str, Any] | None,
    pods: list[dict[str, Any]] | None = None,
) -> Step:
    """The promotion or demotion step for the set as it is now. A spec refused for its
    archive role (replica_cluster.refused) keeps the role the pods have."""
    meta = ds["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    recorded = recorded_role(ac, sts)
    want = wanted(spec)
    if refused(want) is not None and recorded is not None:
        want = dataclasses.replace(want, enabled=recorded == FOLLOWER)
    if pods is None:
        pods = instance_pods(ac, namespace, name) if sts is not None else []
    seen = Seen(
        recorded=recorded,
        pods=len(pods),
        claims=len(instance_pvcs(ac, namespace, name)) if sts is not None else 0,
        rolled_out=rolled_out(sts),
        previous=previous_reason(ds.get("status") or {}),
    )
    return decide(want, seen)


def render_spec(spec: DurableStreamSpec, now: Step) -> DurableStreamSpec:
    """The spec the pods are rendered from: the writers' while a demotion has not yet
    rebuilt the volumes (the template the stopped pods had, so nothing rolls)."""
    if now.follow == spec.replica.enabled:
        return spec
    return spec.changed(replica={**(spec.raw.get("replica") or {}), "enabled": now.follow})


def rendered(statefulset: dict[str, Any], now: Step) -> dict[str, Any]:
    """The rendered StatefulSet with its role recorded, and held at 0 pods while the
    demotion stops the writers or refuses their volumes."""
    statefulset["metadata"]["annotations"][ROLE] = FOLLOWER if now.follow else WRITER
    if now.hold_at_zero:
        statefulset["spec"]["replicas"] = 0
    return statefulset


def rebuild(ac: client.ApiClient, ds: dict[str, Any], now: Step) -> None:
    """Delete the set's claims when the demotion rebuilds its volumes (pods all gone)."""
    if not now.delete_claims:
        return
    meta = ds["metadata"]
    deleted = delete_pvcs(ac, meta["namespace"], meta["name"])
    if deleted:
        events.info(
            ds,
            reason="VolumesDeleted",
            message=f"deleted {', '.join(deleted)} to rebuild them from the followed archive",
        )


def conditions(
    ac: client.ApiClient,
    ds: dict[str, Any],
    spec: DurableStreamSpec,
    sts: dict[str, Any] | None,
    pods: list[dict[str, Any]],
) -> list[dict[str, str]]:
    """The ReplicaCluster condition for the status (none for a set that never followed)."""
    cond = step(ac, ds, spec, sts, pods).condition
    return [] if cond is None else [cond]


def tell(ds: dict[str, Any], new: dict[str, Any]) -> None:
    """An Event for each step entered: Promoting, Promoted, Demoting, DemotionRefused
    (Warning), Rebuilding, Demoted."""
    found = next((c for c in new.get("conditions") or [] if c.get("type") == CONDITION), None)
    for warning, reason, message in step_events(previous_reason(ds.get("status") or {}), found):
        (events.warn if warning else events.info)(ds, reason=reason, message=message)
