"""The status round: what is true of a DurableStream now, written only when it says
something new.

Every ``STATUS_INTERVAL`` seconds (and after each reconcile) the pods say why a server
is not ready (crash loop, OOM), the claims whether every volume holds the spec's size,
and a replica set's Lease who is primary; a replica set's part of the round (role
labels, rolling-update steps, primary-change Events) is in ``replica_set``, a fence
written on the pods in ``lifecycle_actions``. The last reconcile's outcome stands as it
was (``Accepted``), and so does nothing that only an apply can change: a lifecycle
annotation that needs one (a resume, hibernation) makes the round ask to converge.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from stream_operator import KIND
from stream_operator.api.spec import DurableStreamSpec, spec_of
from stream_operator.controllers import (
    analytics_jobs,
    archive_status,
    lease_owner,
    lifecycle_actions,
    operator_metrics,
    replica_cluster_actions,
    replica_set,
    round_reads,
    scaling_actions,
)
from stream_operator.controllers.object_locks import object_lock
from stream_operator.controllers.periodic import Periodic
from stream_operator.decisions import lifecycle, scaling, server_image
from stream_operator.decisions.replica_roles import lease_view
from stream_operator.decisions.rollout import Step
from stream_operator.decisions.status import Outcome, compute_status, same_status
from stream_operator.kube import events, leadership, object_cache
from stream_operator.kube.apply import (
    crd_exists,
    instance_pods,
    instance_pvcs,
    read,
    read_lease,
    write_status,
)
from stream_operator.specs.certificates import certificates_condition
from stream_operator.specs.render import endpoint, lease_name


def observed(
    ac: client.ApiClient,
    ds: dict[str, Any],
    spec: DurableStreamSpec,
    sts: dict[str, Any] | None,
    outcome: Outcome | None,
    extra: list[dict[str, Any]],
    rounds: Periodic,
) -> dict[str, Any]:
    """The status to write; a replica set's rolling update takes its next step here."""
    meta = ds["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    pods = instance_pods(ac, namespace, name) if sts is not None else []
    pods = lifecycle_actions.fence_pods(ac, ds, pods)
    lease = None
    step = None
    if sts is not None and (plan := scaling_actions.plan(ac, ds, spec, sts, pods, rounds)).waiting:
        step = Step(plan.reason, plan.waiting)
        if plan.reason == scaling.SCALING_DOWN:
            rounds.due(namespace, name)  # its second step is applied by a reconcile
    if sts is not None and spec.replicated and step is None:
        lease, pods, step = _replica_set_step(ac, ds, sts, pods)
    archive, archiving = (
        archive_status.observe(ac, ds, spec, lease_view(lease)) if sts is not None else ({}, [])
    )
    status = server_image.status_fields(ds, sts) | compute_status(
        spec=spec,
        generation=meta.get("generation"),
        statefulset=sts,
        endpoint=endpoint(name, namespace, spec),
        outcome=outcome,
        previous=dict(ds.get("status") or {}),
        extra=[
            *extra,
            *_certificates(ac, spec, name),
            *archiving,
            *replica_cluster_actions.conditions(ac, ds, spec, sts, pods),
        ],
        pods=pods,
        pvcs=instance_pvcs(ac, namespace, name) if sts is not None else [],
        lease=lease,
        rollout=step,
    )
    return lifecycle_actions.observed(ds, sts, pods, status | archive)


def _replica_set_step(
    ac: client.ApiClient, ds: dict[str, Any], sts: dict[str, Any], pods: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], Step | None]:
    """The pods labelled with their roles from the Lease, and the rolling update's step
    (none while a lifecycle annotation holds it); the Lease and pods as they are after.
    The Lease gets its owner reference to the DurableStream here (``lease_owner``)."""
    namespace, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
    lease = lease_owner.adopt_lease(ac, ds, read_lease(ac, namespace, lease_name(name)))
    pods = replica_set.label_roles(ac, namespace, pods, lease)
    step = None if lifecycle.holds_rollout(ds, pods) else replica_set.roll(ac, ds, sts, pods, lease)
    if step is not None and step.switchover is not None:
        # The Lease names the new primary: label it and report it in this round (read
        # from the API server: the switchover wrote it through the old primary).
        lease = read_lease(round_reads.fresh(ac), namespace, lease_name(name))
        pods = replica_set.label_roles(ac, namespace, pods, lease)
    return lease, pods, step


def _certificates(ac: client.ApiClient, spec: DurableStreamSpec, name: str) -> list[dict[str, str]]:
    """The Certificates condition, computed afresh each round as Analytics is."""
    if spec.certificates.issuer_ref is None:
        return []
    return certificates_condition(name, spec, crd_exists(ac, "Certificate"))


def write(ac: client.ApiClient, ds: dict[str, Any], new: dict[str, Any]) -> None:
    """Write the status only when it says something new (no churn, no watch events)."""
    meta = ds["metadata"]
    operator_metrics.CONDITION_COUNTS.observe(
        meta["namespace"], meta["name"], new.get("conditions") or []
    )
    if not leadership.may_act():
        return  # the Lease was lost during this reconcile: the new leader writes it
    replica_set.tell_primary_change(ds, dict(ds.get("status") or {}), new)
    replica_cluster_actions.tell(ds, new)
    available = new.get("imageUpdateAvailable")
    if available and available != (ds.get("status") or {}).get("imageUpdateAvailable"):
        message = server_image.update_message(meta["name"], new.get("image") or "", available)
        events.info(ds, reason="ServerImageUpdateAvailable", message=message)
    if not same_status(new, dict(ds.get("status") or {})):
        write_status(ac, meta["namespace"], meta["name"], new)


def refresh(ac: client.ApiClient, name: str, namespace: str, rounds: Periodic) -> bool:
    """One status round; True when the object must converge instead. Its StatefulSet,
    pods, claims and Lease come from the watch-fed cache once it answers, until the round
    writes (``round_reads``, ``object_cache``); before that its claims are listed once;
    its fence ConfigMap is read only when the fence list changed (``lifecycle_actions``)."""
    if not leadership.may_act():
        return False
    ac = round_reads.for_round(ac, object_cache.current())
    trusted = lifecycle_actions.STATUS_ROUND.set(True)
    try:
        return _refresh(ac, name, namespace, rounds)
    finally:
        lifecycle_actions.STATUS_ROUND.reset(trusted)


def _refresh(ac: client.ApiClient, name: str, namespace: str, rounds: Periodic) -> bool:
    with object_lock(namespace, name):
        ds = read(ac, KIND, namespace, name)
        if ds is None or ds["metadata"].get("deletionTimestamp"):
            return False
        if lifecycle.paused(ds):
            lifecycle_actions.hold(ac, ds)
            return False
        sts = read(ac, "StatefulSet", namespace, name)
        if lifecycle.wants_converge(ds, sts):
            return True
        spec = spec_of(ds)
        if sts is not None and not _at_rest(sts, spec):
            ac = round_reads.fresh(ac)
        write(ac, ds, observed(ac, ds, spec, sts, None, _analytics(ac, ds, spec), rounds))
    return False


def _at_rest(sts: dict[str, Any], spec: DurableStreamSpec) -> bool:
    """Whether no rollout or scale is under way: the controller saw the newest template,
    every pod is on one revision, and the spec, the StatefulSet and its pods agree on how
    many. Otherwise the round's steps (a pod deleted, a claim kept or dropped) are
    decided from the API server's answers, not from what the watch last said."""
    status = sts.get("status") or {}
    wanted = (sts.get("spec") or {}).get("replicas")
    return (
        (status.get("observedGeneration") or 0) >= (sts["metadata"].get("generation") or 0)
        and status.get("updateRevision") == status.get("currentRevision")
        and status.get("replicas") == wanted == spec.replicas
    )


def _analytics(
    ac: client.ApiClient, ds: dict[str, Any], spec: DurableStreamSpec
) -> list[dict[str, str]]:
    """The Analytics condition of a status round; the jobs are applied here too where they
    follow the Lease (a replica set's: an in-sync standby, never the primary) or where
    the Spark Operator was installed after the spec asked for analytics."""
    meta = ds["metadata"]
    if spec.replicated and spec.analytics.get("enabled"):
        return analytics_jobs.reconcile(ac, ds, spec)
    cond = analytics_jobs.wanted(ac, meta["name"], meta["namespace"], meta["uid"], spec)[1]
    was_missing = any(
        c.get("type") == "Analytics" and c.get("reason") == "SparkOperatorMissing"
        for c in (ds.get("status") or {}).get("conditions") or []
    )
    if was_missing and cond and cond[0]["reason"] == "Scheduled":
        return analytics_jobs.reconcile(ac, ds, spec)
    return cond
