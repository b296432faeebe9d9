"""The kopf handlers: thin glue between events and the pure functions.

One reconcile for create, update and resume (idempotent by construction), a
timer that keeps the status true to what the StatefulSet reports, and a
delete handler that honours the PVC retention setting.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import kopf
from kubernetes import client, config

from stream_operator import GROUP, PLURAL, VERSION
from stream_operator.analytics import AnalyticsError, render_scheduled_applications
from stream_operator.apply import (
    apply,
    crd_exists,
    delete_pvcs,
    expand_pvcs,
    prune,
    read,
)
from stream_operator.render import desired_objects, endpoint
from stream_operator.spec import quantity_bytes, refused_change, with_defaults
from stream_operator.status import analytics_condition, compute_status

APPLIED_SPEC = f"{GROUP}/applied-spec"
# How often the status is compared with what the StatefulSet reports (seconds).
STATUS_INTERVAL = float(os.environ.get("DS_OPERATOR_STATUS_INTERVAL", "5"))
_api: client.ApiClient | None = None


def api() -> client.ApiClient:
    """In-cluster credentials in a pod, else the kubeconfig (set once, shared)."""
    global _api
    if _api is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        _api = client.ApiClient()
    return _api


def use_api_client(api_client: client.ApiClient) -> None:
    """Point the handlers at a given API server (tests, embedding)."""
    global _api
    _api = api_client


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60


def _applied_spec(statefulset: dict[str, Any] | None) -> dict[str, Any] | None:
    if statefulset is None:
        return None
    raw = ((statefulset.get("metadata") or {}).get("annotations") or {}).get(APPLIED_SPEC)
    return json.loads(raw) if raw else None


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(
    name: str,
    namespace: str,
    uid: str,
    spec: dict[str, Any],
    body: kopf.Body,
    patch: kopf.Patch,
    meta: dict[str, Any],
    status: dict[str, Any],
    logger: logging.Logger,
    **_: Any,
) -> None:
    ac = api()
    sts = read(ac, "StatefulSet", namespace, name)
    refused = refused_change(_applied_spec(sts), dict(spec))
    if refused:
        kopf.warn(body, reason="ChangeRefused", message=refused)
        logger.warning("refusing change: %s", refused)
        analytics = _analytics(ac, name, namespace, uid, dict(spec))[1]
        patch.status.update(_observed(name, namespace, spec, meta, status, sts, refused, analytics))
        return
    full = with_defaults(dict(spec))
    objs = desired_objects(
        name, namespace, uid, dict(spec), servicemonitor_crd=crd_exists(ac, "ServiceMonitor")
    )
    for obj in objs:
        if obj["kind"] == "StatefulSet":
            obj["metadata"]["annotations"][APPLIED_SPEC] = json.dumps(
                {"storage": full["storage"]}, sort_keys=True
            )
        _apply_and_tell(ac, obj, body)
    grown = expand_pvcs(ac, namespace, name, full["storage"]["size"], quantity_bytes)
    if grown:
        kopf.info(
            body,
            reason="Expanding",
            message=f"storage {full['storage']['size']} requested for {', '.join(grown)}",
        )
    analytics = _reconcile_analytics(ac, name, namespace, uid, dict(spec), body)
    sts = read(ac, "StatefulSet", namespace, name)
    patch.status.update(_observed(name, namespace, spec, meta, status, sts, None, analytics))


def _apply_and_tell(ac: client.ApiClient, obj: dict[str, Any], body: kopf.Body) -> None:
    outcome = apply(ac, obj)
    if outcome != "unchanged":
        kopf.info(
            body,
            reason=outcome.capitalize(),
            message=f"{outcome} {obj['kind']} {obj['metadata']['name']}",
        )


def _analytics(
    ac: client.ApiClient, name: str, namespace: str, uid: str, spec: dict
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """What ``spec.analytics`` asks for (None: nothing can be applied) and its condition.

    Computed afresh every time, never carried over from the last status: a timer
    that read the status before a reconcile must not write an old condition back.
    """
    try:
        wanted = render_scheduled_applications(name, namespace, uid, spec)
    except AnalyticsError as exc:
        return None, analytics_condition(error=str(exc))
    if not wanted:
        return wanted, []
    if not crd_exists(ac, "ScheduledSparkApplication"):
        return None, analytics_condition(spark_operator=False)
    return wanted, analytics_condition(scheduled=wanted)


def _reconcile_analytics(
    ac: client.ApiClient, name: str, namespace: str, uid: str, spec: dict, body: kopf.Body
) -> list[dict[str, Any]]:
    """Keep the ScheduledSparkApplications ``spec.analytics`` asks for; returns its condition.

    Analytics is optional and separate: a spec it cannot carry out (or a cluster
    without the Spark Operator) is reported in its own condition and leaves the
    stream servers, and the jobs already scheduled, as they are.
    """
    wanted, cond = _analytics(ac, name, namespace, uid, spec)
    if cond and cond[0]["reason"] == "InvalidAnalytics":
        kopf.warn(body, reason="InvalidAnalytics", message=cond[0]["message"])
    if wanted is None:
        return cond
    if wanted or crd_exists(ac, "ScheduledSparkApplication"):
        for obj in wanted:
            _apply_and_tell(ac, obj, body)
        selector = {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "analytics"}
        keep = {obj["metadata"]["name"] for obj in wanted}
        for gone in prune(ac, "ScheduledSparkApplication", namespace, selector, keep):
            kopf.info(body, reason="Deleted", message=f"deleted ScheduledSparkApplication {gone}")
    return cond


def _observed(
    name, namespace, spec, meta, status, sts, refused: str | None, extra: list[dict[str, Any]]
) -> dict[str, Any]:
    return compute_status(
        spec=dict(spec),
        generation=meta.get("generation"),
        statefulset=sts,
        endpoint=endpoint(name, namespace, spec),
        refused=refused,
        previous=dict(status),
        extra=extra,
    )


@kopf.timer(GROUP, VERSION, PLURAL, interval=STATUS_INTERVAL, initial_delay=1.0)
def refresh_status(
    name: str,
    namespace: str,
    uid: str,
    spec: dict[str, Any],
    meta: dict[str, Any],
    status: dict[str, Any],
    body: kopf.Body,
    patch: kopf.Patch,
    **_: Any,
) -> None:
    ac = api()
    sts = read(ac, "StatefulSet", namespace, name)
    refused = refused_change(_applied_spec(sts), dict(spec))
    analytics = _analytics(ac, name, namespace, uid, dict(spec))[1]
    was_missing = any(
        c.get("type") == "Analytics" and c.get("reason") == "SparkOperatorMissing"
        for c in status.get("conditions") or []
    )
    if was_missing and analytics and analytics[0]["reason"] == "Scheduled":
        # The Spark Operator was installed after the spec asked for analytics.
        analytics = _reconcile_analytics(ac, name, namespace, uid, dict(spec), body)
    new = _observed(name, namespace, spec, meta, status, sts, refused, analytics)
    if {k: v for k, v in new.items() if k != "conditions"} != {
        k: v for k, v in dict(status).items() if k in new and k != "conditions"
    } or _condition_states(new) != _condition_states(dict(status)):
        patch.status.update(new)


def _condition_states(status: dict[str, Any]) -> list[tuple]:
    return sorted(
        (c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []
    )


@kopf.on.delete(GROUP, VERSION, PLURAL)
def cleanup(
    name: str,
    namespace: str,
    spec: dict[str, Any],
    body: kopf.Body,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Owned objects go by garbage collection; PVCs follow the retention setting."""
    if with_defaults(dict(spec))["storage"]["pvcRetention"] == "Delete":
        deleted = delete_pvcs(api(), namespace, name)
        logger.info("deleted PVCs %s", deleted)
    else:
        logger.info("keeping the PVCs of %s (pvcRetention: Retain)", name)
