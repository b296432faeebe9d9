"""The ScheduledSparkApplications ``spec.analytics`` asks for, kept in the cluster, and
the Analytics condition: glue between the reconcile and ``analytics`` (what the jobs
are) and ``analytics_source`` (which standby's volume a replica set's jobs read).

Analytics is optional and separate: a spec it cannot carry out (or a cluster without
the Spark Operator) is reported in its own condition and leaves the stream servers,
and the jobs already scheduled, as they are. The condition is computed afresh every
time, never carried over from the last status: a round that read the status before a
reconcile must not write an old condition back.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from stream_operator.api.spec import DurableStreamSpec
from stream_operator.decisions.analytics_source import choose_source
from stream_operator.decisions.replica_roles import lease_view
from stream_operator.decisions.status import analytics_condition
from stream_operator.kube import events
from stream_operator.kube.apply import crd_exists, list_labelled, prune, read_lease
from stream_operator.specs.analytics import AnalyticsError, render_scheduled_applications
from stream_operator.specs.render import lease_name

Objects = list[dict[str, Any]]
KIND = "ScheduledSparkApplication"


def wanted(
    ac: client.ApiClient, name: str, namespace: str, uid: str, spec: DurableStreamSpec
) -> tuple[Objects | None, list[dict[str, str]]]:
    """What ``spec.analytics`` asks for (None: nothing can be applied) and its condition."""
    try:
        jobs = render_scheduled_applications(name, namespace, uid, spec)
    except AnalyticsError as exc:
        return None, analytics_condition(error=str(exc))
    if not jobs:
        return jobs, []
    if not crd_exists(ac, KIND):
        return None, analytics_condition(spark_operator=False)
    if not spec.replicated:
        return jobs, analytics_condition(scheduled=jobs)
    # A replica set: one in-sync standby's volume (analytics_source.py).
    view = lease_view(read_lease(ac, namespace, lease_name(name)))
    current = [
        int(r)
        for obj in list_labelled(ac, KIND, namespace, _selector(name))
        if (
            r := (obj["metadata"].get("labels") or {}).get("streams.pyds.dev/replica", "")
        ).isdigit()
    ]
    source = choose_source(name, spec.replicas, view, current)
    if source.replica is None:
        return None, analytics_condition(waiting=source.waiting)
    jobs = render_scheduled_applications(
        name, namespace, uid, spec, replicas=[source.replica], hold=source.waiting is not None
    )
    if source.waiting is not None:
        return jobs, analytics_condition(waiting=source.waiting)
    return jobs, analytics_condition(scheduled=jobs, source=f"{name}-{source.replica}")


def reconcile(
    ac: client.ApiClient, body: dict[str, Any], spec: DurableStreamSpec
) -> list[dict[str, str]]:
    """Keep the ScheduledSparkApplications ``spec.analytics`` asks for; returns its
    condition. ``body``: the DurableStream as read (Events are posted on it)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    jobs, cond = wanted(ac, name, namespace, meta["uid"], spec)
    _tell(body, cond)
    if jobs is None:
        return cond
    if jobs or crd_exists(ac, KIND):
        for obj in jobs:
            events.apply_and_tell(ac, obj, body)
        keep = {obj["metadata"]["name"] for obj in jobs}
        for gone in prune(ac, KIND, namespace, _selector(name), keep):
            events.info(body, reason="Deleted", message=f"deleted {KIND} {gone}")
    return cond


def _tell(body: dict[str, Any], cond: list[dict[str, str]]) -> None:
    """A Warning Event for an analytics spec that cannot be carried out, and for the first
    round with no standby in sync to read from."""
    if cond and cond[0]["reason"] == "InvalidAnalytics":
        events.warn(body, reason="InvalidAnalytics", message=cond[0]["message"])
    if (
        cond
        and cond[0]["reason"] == "NoStandbyInSync"
        and not any(
            c.get("reason") == "NoStandbyInSync"
            for c in (body.get("status") or {}).get("conditions") or []
        )
    ):
        events.warn(body, reason="NoStandbyInSync", message=cond[0]["message"])


def _selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "analytics"}
