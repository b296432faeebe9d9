"""One reconcile: make the cluster what the stored spec asks for, then write what is
now true (``status_round``).

Idempotent by construction, run on create, update and resume and again every
``RESYNC_INTERVAL`` seconds, so that a deleted or hand-edited object is put back. It
runs under the object's lock from a fresh read of it (``object_locks``), parses the
spec once (``spec.with_defaults``) and hands that typed spec to every step. A change
the operator will not carry out (``spec.refused_change``, two certificate sources, a
scale-down that would lose the primary) is refused whole and reported; at one replica
the old set's Lease and claims are deleted and a scale-up held until they are gone
(``scaling_actions``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import GROUP, KIND
from stream_operator.api import names, quantities
from stream_operator.api.spec import DurableStreamSpec, refused_change, spec_of
from stream_operator.configuration import operator_settings
from stream_operator.controllers import (
    analytics_jobs,
    builtin_tls,
    lifecycle_actions,
    operator_metrics,
    replica_cluster_actions,
    scaling_actions,
    status_round,
    token_rotation,
)
from stream_operator.controllers.object_locks import object_lock
from stream_operator.controllers.periodic import Periodic
from stream_operator.decisions import lifecycle, replica_cluster, scaling, server_image
from stream_operator.decisions.plan import plan_expansion, smaller_pvcs, stale_objects
from stream_operator.decisions.status import Outcome
from stream_operator.kube import events, leadership
from stream_operator.kube.apply import (
    RENDERED_KINDS,
    crd_exists,
    create_secret,
    delete,
    grow_pvc,
    instance_pods,
    instance_pvcs,
    list_labelled,
    read,
    read_secret_value,
    remove_annotation,
    storage_class,
)
from stream_operator.kube.switchover_call import TOKEN_KEY, new_token
from stream_operator.specs.certificates import refused_certificates
from stream_operator.specs.render import (
    MANAGED_BY,
    desired_objects,
    fence_configmap_name,
    render_replication_secret,
    replication_secret_name,
)

APPLIED_SPEC = f"{GROUP}/applied-spec"
# API errors that retrying soon will not fix: wait for the next resync instead.
_PERMANENT = (400, 403, 404, 422)
Conditions = list[dict[str, Any]]


def converge(
    ac: client.ApiClient,
    name: str,
    namespace: str,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    rounds: Periodic,
) -> None:
    """Make the cluster what the stored spec asks for, then write what is now true.

    A failure is reported in the status (Accepted=False, Ready=False, the API
    server's message) before anything is raised; only an error that a quick retry
    may fix is raised for kopf to retry, the rest waits for the next resync.
    """
    if not leadership.may_act():
        logger.warning(
            "not reconciling %s/%s: this operator does not hold the lease", namespace, name
        )
        return
    with object_lock(namespace, name):
        ds = read(ac, KIND, namespace, name)
        if ds is None or ds["metadata"].get("deletionTimestamp"):
            return
        if lifecycle.paused(ds):
            lifecycle_actions.hold(ac, ds)  # streams.pyds.dev/reconcile: paused
            return
        spec = spec_of(ds)
        started = time.monotonic()
        try:
            outcome, analytics = _reconcile(ac, ds, spec, logger, rounds)
            error = None
        except ApiException as exc:
            error = exc
            outcome = Outcome("ApplyFailed", _api_error(exc))
            meta = ds["metadata"]
            analytics = analytics_jobs.wanted(ac, name, namespace, meta["uid"], spec)[1]
            events.warn(ds, reason="ApplyFailed", message=outcome.message)
        operator_metrics.record_reconcile(
            namespace, name, outcome.reason, time.monotonic() - started, time.time()
        )
        rounds.converged(namespace, name)
        sts = read(ac, "StatefulSet", namespace, name)
        new = status_round.observed(ac, ds, spec, sts, outcome, analytics, rounds)
        status_round.write(ac, ds, new)
    if error is not None and error.status not in _PERMANENT:
        raise kopf.TemporaryError(outcome.message, delay=10)


def _api_error(exc: ApiException) -> str:
    try:
        detail = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        detail = None
    return f"the API server refused a change ({exc.status} {exc.reason}): {detail or exc.body}"


def _applied_spec(statefulset: dict[str, Any] | None) -> dict[str, Any] | None:
    """The spec last applied, as far as a later change is checked against it (storage,
    bootstrap)."""
    if statefulset is None:
        return None
    raw = ((statefulset.get("metadata") or {}).get("annotations") or {}).get(APPLIED_SPEC)
    return json.loads(raw) if raw else None


def _refused(
    ac: client.ApiClient, ds: dict[str, Any], spec: DurableStreamSpec, sts: dict[str, Any] | None
) -> str | None:
    """Why the spec is refused whole, or None. Hibernation is no scale-down: the claims
    and the Lease stay (lifecycle.py)."""
    return (
        refused_change(_applied_spec(sts), spec)
        or replica_cluster.refused(replica_cluster.wanted(spec))
        or refused_certificates(spec)
        or (None if lifecycle.hibernating(ds) else scaling_actions.refused(ac, ds, spec, sts))
    )


def _reconcile(
    ac: client.ApiClient,
    ds: dict[str, Any],
    spec: DurableStreamSpec,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    rounds: Periodic,
) -> tuple[Outcome, Conditions]:
    """Apply the spec; returns what became of it and the Analytics condition."""
    meta = ds["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    invalid = names.refused(name)
    if invalid:  # a cluster that did not run the CRD's rules: nothing can be rendered
        events.warn(ds, reason=names.INVALID, message=invalid)
        return Outcome(names.INVALID, invalid), []
    sts = read(ac, "StatefulSet", namespace, name)
    if builtin_tls.keep_plain_http(ac, ds, spec, sts):
        spec = spec_of(ds)
    refused = _refused(ac, ds, spec, sts)
    role = replica_cluster_actions.step(ac, ds, spec, sts)
    if refused:
        events.warn(ds, reason="ChangeRefused", message=refused)
        logger.warning("refusing change: %s", refused)
        if not role.hold_at_zero:  # a demotion's stopped writers are never woken
            lifecycle_actions.scale_anyway(ac, ds, sts)  # hibernation goes on all the same
        analytics = analytics_jobs.wanted(ac, name, namespace, uid, spec)[1]
        return Outcome("ChangeRefused", refused), analytics
    if spec.replicated:
        _ensure_replication_secret(ac, ds)
        builtin_tls.ensure(ac, ds, spec)  # before the pods that mount its Secrets
        token_rotation.rotate(ac, ds)
    replica_cluster_actions.rebuild(ac, ds, role)
    objs = _rendered(ac, ds, replica_cluster_actions.render_spec(spec, role), sts, rounds)
    for obj in objs:
        if obj["kind"] == "StatefulSet":
            replica_cluster_actions.rendered(obj, role)
    for obj in objs:
        events.apply_and_tell(ac, obj, ds)
    if server_image.UPDATE_NOW in (meta.get("annotations") or {}):
        remove_annotation(ac, namespace, name, server_image.UPDATE_NOW)
    _prune_rendered(ac, ds, objs)
    outcome = _grow_volumes(ac, ds, spec.storage.size)
    return outcome, analytics_jobs.reconcile(ac, ds, spec)


def _rendered(
    ac: client.ApiClient,
    ds: dict[str, Any],
    spec: DurableStreamSpec,
    sts: dict[str, Any] | None,
    rounds: Periodic,
) -> list[dict[str, Any]]:
    """The objects to apply, in order.

    The image is the operator's or the one held (server_image.py). A scale-up from one
    replica waits (the StatefulSet kept at one) until the old set's copies are gone; a
    scale-down to one first stops pods 1.. with the set's template kept (scaling.py).
    """
    meta = ds["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    image = server_image.for_object(ds, sts).image
    allowed = scaling_actions.plan(ac, ds, spec, sts, None, rounds).replicas
    keep_set = (
        scaling.set_size_while_scaling_to_one(
            name,
            spec.replicas,
            sts,
            instance_pods(ac, namespace, name),
            read(ac, "ConfigMap", namespace, f"{name}-config"),
        )
        if spec.replicas == 1 and sts is not None
        else None
    )
    objs = desired_objects(
        name,
        namespace,
        uid,
        spec.changed(image=image, replicas=keep_set or allowed),
        podmonitor_crd=crd_exists(ac, "PodMonitor"),
        certificate_crd=spec.certificates.issuer_ref is not None and crd_exists(ac, "Certificate"),
        # Labels on every PodMonitor (DS_OPERATOR_PODMONITOR_LABELS, the chart's
        # operator.podMonitorLabels): kube-prometheus-stack finds monitors by label.
        monitor_labels=dict(operator_settings.current().monitor_labels),
    )
    for obj in objs:
        if obj["kind"] == "StatefulSet":
            annotations = obj["metadata"]["annotations"]
            applied = {"storage": spec.raw["storage"]}
            if spec.raw.get("bootstrap"):
                applied["bootstrap"] = spec.raw["bootstrap"]  # immutable (refused_change)
            annotations[APPLIED_SPEC] = json.dumps(applied, sort_keys=True)
            annotations[server_image.IN_USE] = server_image.record(image, meta.get("generation"))
            if keep_set:
                obj["spec"]["replicas"] = 1
            lifecycle.hibernated(ds, obj)
            lifecycle.restarted(ds, obj)
    return objs


def _ensure_replication_secret(ac: client.ApiClient, ds: dict[str, Any]) -> None:
    """The replica set's peer token, made once: never rendered from the spec, so no apply
    overwrites it and no prune removes it (it goes with the DurableStream)."""
    meta = ds["metadata"]
    secret = replication_secret_name(meta["name"])
    if read_secret_value(ac, meta["namespace"], secret, TOKEN_KEY) is not None:
        return
    body = render_replication_secret(meta["name"], meta["namespace"], meta["uid"], new_token())
    if create_secret(ac, body):
        events.info(ds, reason="Created", message=f"created Secret {secret} (the peer token)")


def _prune_rendered(ac: client.ApiClient, ds: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    """Delete what this DurableStream owns but no longer renders (a disabled PodMonitor)."""
    meta = ds["metadata"]
    selector = {
        "app.kubernetes.io/instance": meta["name"],
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
    live = [
        obj
        for kind in RENDERED_KINDS
        for obj in list_labelled(ac, kind, meta["namespace"], selector)
    ]
    rendered = [(o["kind"], o["metadata"]["name"]) for o in objs]
    # Written by the status round, not rendered here (lifecycle_actions.fence_pods).
    rendered.append(("ConfigMap", fence_configmap_name(meta["name"])))
    for kind, name in stale_objects(live, rendered, meta["uid"]):
        if delete(ac, kind, meta["namespace"], name):
            events.info(ds, reason="Deleted", message=f"deleted {kind} {name}: no longer rendered")


def _grow_volumes(ac: client.ApiClient, ds: dict[str, Any], size: str) -> Outcome:
    """Ask for ``size`` on the smaller PVCs whose StorageClass allows growth; say if any cannot."""
    meta = ds["metadata"]
    smaller = smaller_pvcs(
        instance_pvcs(ac, meta["namespace"], meta["name"]), size, quantities.as_bytes
    )
    if not smaller:
        return Outcome()
    names = {(p.get("spec") or {}).get("storageClassName") or "" for p in smaller} - {""}
    plan = plan_expansion(smaller, {cls: storage_class(ac, cls) for cls in sorted(names)})
    for pvc in plan.grow:
        grow_pvc(ac, meta["namespace"], pvc, size)
    if plan.grow:
        events.info(
            ds, reason="Expanding", message=f"storage {size} requested for {', '.join(plan.grow)}"
        )
    if plan.blocked:
        message = plan.message(size)
        events.warn(ds, reason="ExpansionNotAllowed", message=message)
        return Outcome("ExpansionNotAllowed", message)
    return Outcome()
