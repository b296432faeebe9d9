"""The kopf handlers: thin glue between events and the pure functions.

Over 400 lines on purpose: every handler and the periodic rounds share one object lock
and one status write path.

One reconcile (idempotent by construction) run on create, update and resume
and again every ``RESYNC_INTERVAL`` seconds, so that a deleted or hand-edited
object is put back; a status refresh every ``STATUS_INTERVAL`` seconds that
keeps the status true to what the StatefulSet reports; and a delete handler,
only for ``pvcRetention: Delete``, that deletes the claims. A replica set's part
of the status round (role labels, rolling-update steps, primary-change Events) is
in ``replica_set``; at one replica, both rounds delete the old set's Lease and claims
and hold a scale-up until they are gone (``scaling``).

The periodic work runs per object on a small pool of worker threads
(``periodic``) over the DurableStreams an event handler keeps track of, not in
kopf timers: kopf puts its finalizer on every object that has a timer, and a
finalizer nobody removes (the operator uninstalled) makes ``kubectl delete``
hang. So an object carries the finalizer only while its spec asks for
``pvcRetention: Delete``, the one case where the operator has something to do
before the object goes. Every API request the handlers make has a timeout
(``API_TIMEOUT``), so no round waits forever on one.

Nothing is written unless ``leadership.may_act()``: with leader election on,
a process that lost the Lease (or could not renew it in time) writes nothing.

Every reconcile and status write for one DurableStream runs under that
object's lock and starts from a fresh read of it: a timer holding an older
copy can neither apply an old spec over a new one nor write an old outcome
back into the status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import defaultdict
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from stream_operator import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    leadership,
    lifecycle,
    lifecycle_actions,
    metrics,
    replica_set,
    scaling,
    server_image,
)
from stream_operator.analytics import AnalyticsError, render_scheduled_applications
from stream_operator.analytics_source import choose_source
from stream_operator.apply import (
    RENDERED_KINDS,
    apply,
    crd_exists,
    create_secret,
    delete,
    delete_pvcs,
    grow_pvc,
    instance_pods,
    instance_pvcs,
    list_labelled,
    prune,
    read,
    read_lease,
    read_secret_value,
    remove_annotation,
    storage_class,
    write_status,
)
from stream_operator.certificates import (
    certificates_condition,
    issuer_ref,
    refused_certificates,
)
from stream_operator.periodic import Periodic
from stream_operator.plan import plan_expansion, smaller_pvcs, stale_objects
from stream_operator.render import (
    MANAGED_BY,
    desired_objects,
    endpoint,
    lease_name,
    render_replication_secret,
    replication_secret_name,
)
from stream_operator.replica_roles import (
    lease_view,
    refused_scale_down,
)
from stream_operator.rollout import Step
from stream_operator.spec import quantity_bytes, refused_change, replicated, with_defaults
from stream_operator.status import Outcome, analytics_condition, compute_status, same_status
from stream_operator.switchover import TOKEN_KEY, new_token

APPLIED_SPEC = f"{GROUP}/applied-spec"
# How often the status is compared with what the StatefulSet reports (seconds).
STATUS_INTERVAL = float(os.environ.get("DS_OPERATOR_STATUS_INTERVAL", "5"))
# How often every DurableStream is reconciled again, to undo drift (seconds): a
# deleted Service, a hand-scaled StatefulSet, a StorageClass that now allows growth.
RESYNC_INTERVAL = float(os.environ.get("DS_OPERATOR_RESYNC_INTERVAL", "60"))
# How long one request of the handlers to the API server may take (seconds, connecting
# and answering): a request the API server (or the network) holds up fails, and the
# round that made it ends, instead of holding its worker.
API_TIMEOUT = float(os.environ.get("DS_OPERATOR_API_TIMEOUT", "10"))
# Worker threads for the periodic rounds: each object is on at most one at a time, so
# this many objects whose rounds hang hold up the rest (until /healthz restarts us).
PERIODIC_WORKERS = int(os.environ.get("DS_OPERATOR_PERIODIC_WORKERS", "4"))
# A worker on one object for this long is stuck (every call of a round has a timeout far
# shorter): /healthz fails, and the kubelet restarts the operator (seconds).
STALL_AFTER = float(os.environ.get("DS_OPERATOR_STALL_SECONDS", "300"))
# Labels on every PodMonitor made for a DurableStream (JSON object; the chart's
# operator.podMonitorLabels): kube-prometheus-stack finds monitors by label. The older
# setting for ServiceMonitors is read when the new one is not given.
MONITOR_LABELS: dict[str, str] = json.loads(
    os.environ.get("DS_OPERATOR_PODMONITOR_LABELS")
    or os.environ.get("DS_OPERATOR_SERVICEMONITOR_LABELS")
    or "{}"
)
# API errors that retrying soon will not fix: wait for the next resync instead.
_PERMANENT = (400, 403, 404, 422)
_api: client.ApiClient | None = None


def api() -> client.ApiClient:
    """In-cluster credentials in a pod, else the kubeconfig (set once, shared)."""
    global _api
    if _api is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        _api = new_api_client()
        # Which replica wrote what shows in the API server's audit log.
        _api.user_agent = f"durable-streams-operator ({leadership.identity()})"
    return _api


class _Timed(client.ApiClient):
    """An API client that gives every request a timeout: the client's default is to wait
    forever. A request given no timeout of its own gets ``API_TIMEOUT``.

    ``call_api`` is where every request of the generated API classes goes (kubernetes
    37 and later; the client has no ``request`` method any more).
    """

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None and len(args) < 4:
            kwargs["_request_timeout"] = API_TIMEOUT
        return super().call_api(method, url, *args, **kwargs)


class _LeaderOnlyWrites(_Timed):
    """An API client that refuses to write once this process may not act.

    ``may_act`` is checked when a reconcile or a status round starts; a process frozen
    in the middle of one (SIGSTOP, a stalled node) and thawed after another operator
    took the Lease would otherwise carry on with what it read before, and, say, prune
    what the new leader just created. Each write is checked here instead.
    """

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() not in ("GET", "HEAD", "OPTIONS") and not leadership.may_act():
            raise kopf.TemporaryError(f"not writing ({method} {url}): the lease is not held")
        return super().call_api(method, url, *args, **kwargs)


def new_api_client(
    configuration: client.Configuration | None = None, *, leader_only: bool = True
) -> client.ApiClient:
    """An API client whose requests time out, for ``configuration`` (None: the default,
    as loaded from the cluster or the kubeconfig). ``leader_only``: writes refused while
    this process may not act (the handlers' client); the leader election's own client,
    which writes the Lease to become leader, is not."""
    return (_LeaderOnlyWrites if leader_only else _Timed)(configuration)


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
    # kopf's own requests: a connection that never opens, or a request never answered,
    # fails and is retried instead of holding its handler (kopf's defaults: none, 5 min).
    settings.watching.connect_timeout = API_TIMEOUT
    settings.networking.connect_timeout = API_TIMEOUT
    settings.networking.request_timeout = 3 * API_TIMEOUT
    # The timers are short synchronous calls that end on their own: a deletion that
    # finds one running waits for it briefly, then checks every second, not every minute.
    settings.background.instant_exit_timeout = 0.5
    settings.background.cancellation_polling = 1.0
    # Watching given namespaces: no cluster-wide list/watch of namespaces and CRDs,
    # so that Roles in those namespaces (and a ClusterRole reading CRDs and
    # StorageClasses by name) are all the operator needs; the namespaces are taken as
    # named, and the DurableStream CRD must exist when the operator starts.
    settings.scanning.disabled = not settings.peering.clusterwide
    metrics.restart()
    _periodic.start(STATUS_INTERVAL, RESYNC_INTERVAL, STALL_AFTER)


@kopf.on.startup()
async def heartbeat(**_: Any) -> None:
    """A beat from kopf's event loop every few seconds, for ``/healthz`` (loop_alive)."""
    loop = asyncio.get_running_loop()

    def beat() -> None:
        _beats[0] = time.monotonic()
        loop.call_later(_BEAT_EVERY, beat)

    beat()


_BEAT_EVERY = 5.0
_beats = [time.monotonic()]  # a loop not yet started counts as beating


def loop_alive() -> bool:
    """Whether kopf's event loop ran its heartbeat lately (a blocked loop does not)."""
    return time.monotonic() - _beats[0] < 6 * _BEAT_EVERY


def alive() -> bool:
    """For ``/healthz``: kopf's event loop beats, and no periodic worker is stuck or gone."""
    return loop_alive() and _periodic.alive()


@kopf.on.cleanup()
def stop_periodic(**_: Any) -> None:
    _periodic.stop()


def _applied_spec(statefulset: dict[str, Any] | None) -> dict[str, Any] | None:
    if statefulset is None:
        return None
    raw = ((statefulset.get("metadata") or {}).get("annotations") or {}).get(APPLIED_SPEC)
    return json.loads(raw) if raw else None


_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks[(namespace, name)]


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(name: str, namespace: str, logger: logging.Logger, **_: Any) -> None:
    converge(name, namespace, logger)


@kopf.on.update(GROUP, VERSION, PLURAL, annotations={server_image.UPDATE_NOW: kopf.PRESENT})
def update_server_image(name: str, namespace: str, logger: logging.Logger, **_: Any) -> None:
    """The owner asks for the operator's server image now (server_image.py, ``hold``)."""
    converge(name, namespace, logger)


@kopf.on.event(GROUP, VERSION, PLURAL)
def track(type: str | None, name: str, namespace: str, **_: Any) -> None:
    """Keep the set of DurableStreams the periodic work goes over (no finalizer needed)."""
    if type == "DELETED":
        _periodic.forget(namespace, name)
        metrics.forget(namespace, name)
    else:
        _periodic.track(namespace, name)


def _round(namespace: str, name: str, resync: bool) -> None:
    """One object's periodic round: a whole reconcile when ``resync`` says it is due, else a
    status refresh; an error that the next round may not see is logged, not raised."""
    log = logging.getLogger("stream_operator.periodic")
    try:
        if resync:
            converge(name, namespace, log)
        else:
            refresh_status(name, namespace)
    except kopf.TemporaryError as exc:
        log.warning("%s/%s: %s (next try in the next round)", namespace, name, exc)


_periodic = Periodic(_round, workers=PERIODIC_WORKERS)


def converge(name: str, namespace: str, logger: logging.Logger) -> None:
    """Make the cluster what the stored spec asks for, then write what is now true.

    A failure is reported in the status (Accepted=False, Ready=False, the API
    server's message) before anything is raised; only an error that a quick retry
    may fix is raised for kopf to retry, the rest waits for the next resync.
    """
    ac = api()
    if not leadership.may_act():
        logger.warning(
            "not reconciling %s/%s: this operator does not hold the lease", namespace, name
        )
        return
    with _lock(namespace, name):
        ds = read(ac, KIND, namespace, name)
        if ds is None or ds["metadata"].get("deletionTimestamp"):
            return
        if lifecycle.paused(ds):
            lifecycle_actions.hold(ac, ds)  # streams.pyds.dev/reconcile: paused
            return
        spec = dict(ds.get("spec") or {})
        started = time.monotonic()
        try:
            outcome, analytics = _reconcile(ac, ds, logger)
            error = None
        except ApiException as exc:
            error = exc
            outcome = Outcome("ApplyFailed", _api_error(exc))
            analytics = _analytics(ac, name, namespace, ds["metadata"]["uid"], spec)[1]
            kopf.warn(ds, reason="ApplyFailed", message=outcome.message)
        metrics.record_reconcile(
            namespace, name, outcome.reason, time.monotonic() - started, time.time()
        )
        _periodic.converged(namespace, name)
        sts = read(ac, "StatefulSet", namespace, name)
        _write(ac, ds, _observed(ds, sts, outcome, analytics))
    if error is not None and error.status not in _PERMANENT:
        raise kopf.TemporaryError(outcome.message, delay=10)


def _api_error(exc: ApiException) -> str:
    try:
        detail = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        detail = None
    return f"the API server refused a change ({exc.status} {exc.reason}): {detail or exc.body}"


def _reconcile(
    ac: client.ApiClient, ds: dict[str, Any], logger: logging.Logger
) -> tuple[Outcome, list[dict[str, Any]]]:
    """Apply the spec; returns what became of it and the Analytics condition."""
    meta = ds["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    spec = dict(ds.get("spec") or {})
    sts = read(ac, "StatefulSet", namespace, name)
    # Hibernation is no scale-down: the claims and the Lease stay (lifecycle.py).
    refused = (
        refused_change(_applied_spec(sts), spec)
        or refused_certificates(spec)
        or (None if lifecycle.hibernating(ds) else _refused_scale_down(ac, ds, sts))
    )
    if refused:
        kopf.warn(ds, reason="ChangeRefused", message=refused)
        logger.warning("refusing change: %s", refused)
        lifecycle_actions.scale_anyway(ac, ds, sts)  # hibernation goes on all the same
        analytics = _analytics(ac, name, namespace, uid, spec)[1]
        return Outcome("ChangeRefused", refused), analytics
    full = with_defaults(spec)
    if replicated(spec):
        _ensure_replication_secret(ac, ds)
    image = server_image.for_object(ds, sts).image  # the operator's, or the one held
    # A scale-up from one replica waits (the StatefulSet kept at one) until the old set's
    # copies are gone (scaling.py).
    allowed = _scaling(ac, ds, sts, None).replicas
    # A scale-down to one first stops pods 1.. with the set's template kept (scaling.py).
    keep_set = (
        scaling.set_size_while_scaling_to_one(
            name,
            full["replicas"],
            sts,
            instance_pods(ac, namespace, name),
            read(ac, "ConfigMap", namespace, f"{name}-config"),
        )
        if full["replicas"] == 1 and sts is not None
        else None
    )
    rendered = keep_set or allowed
    objs = desired_objects(
        name,
        namespace,
        uid,
        {**spec, "image": image}
        if rendered == full["replicas"]
        else {**spec, "image": image, "replicas": rendered},
        podmonitor_crd=crd_exists(ac, "PodMonitor"),
        certificate_crd=issuer_ref(spec) is not None and crd_exists(ac, "Certificate"),
        monitor_labels=MONITOR_LABELS,
    )
    for obj in objs:
        if obj["kind"] == "StatefulSet":
            obj["metadata"]["annotations"][APPLIED_SPEC] = json.dumps(
                {"storage": full["storage"]}, sort_keys=True
            )
            obj["metadata"]["annotations"][server_image.IN_USE] = server_image.record(
                image, meta.get("generation")
            )
            if keep_set:
                obj["spec"]["replicas"] = 1
            lifecycle.hibernated(ds, obj)
        _apply_and_tell(ac, obj, ds)
    if server_image.UPDATE_NOW in (meta.get("annotations") or {}):
        remove_annotation(ac, namespace, name, server_image.UPDATE_NOW)
    _prune_rendered(ac, ds, objs)
    outcome = _grow_volumes(ac, ds, full["storage"]["size"])
    analytics = _reconcile_analytics(ac, name, namespace, uid, spec, ds)
    return outcome, analytics


def _ensure_replication_secret(ac: client.ApiClient, ds: dict[str, Any]) -> None:
    """The replica set's peer token, made once: never rendered from the spec, so no apply
    overwrites it and no prune removes it (it goes with the DurableStream)."""
    meta = ds["metadata"]
    secret = replication_secret_name(meta["name"])
    if read_secret_value(ac, meta["namespace"], secret, TOKEN_KEY) is not None:
        return
    body = render_replication_secret(meta["name"], meta["namespace"], meta["uid"], new_token())
    if create_secret(ac, body):
        kopf.info(ds, reason="Created", message=f"created Secret {secret} (the peer token)")


def _refused_scale_down(
    ac: client.ApiClient, ds: dict[str, Any], sts: dict[str, Any] | None
) -> str | None:
    """A replica set's scale-down that would remove its primary or leave a lagging pod
    alone: refused until the user has failed over (replica_roles.refused_scale_down)."""
    if sts is None:
        return None
    meta = ds["metadata"]
    current = int((sts.get("spec") or {}).get("replicas") or 0)
    wanted = int(with_defaults(dict(ds.get("spec") or {}))["replicas"])
    if wanted >= current:
        return None
    view = lease_view(read_lease(ac, meta["namespace"], lease_name(meta["name"])))
    return refused_scale_down(meta["name"], current, wanted, view)


def _scaling(
    ac: client.ApiClient,
    ds: dict[str, Any],
    sts: dict[str, Any] | None,
    pods: list[dict[str, Any]] | None,
) -> scaling.ScalePlan:
    """At one replica, the old set's Lease and the removed pods' claims deleted once the
    removed pods are gone; the replicas the StatefulSet may have now (scaling.py).
    ``pods``: the instance's pods, if already listed. Reads nothing more unless the
    StatefulSet is at one pod."""
    meta = ds["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    wanted = int(with_defaults(dict(ds.get("spec") or {}))["replicas"])
    if sts is None or int((sts.get("spec") or {}).get("replicas") or 0) != 1:
        return scaling.ScalePlan(wanted)
    plan = scaling.plan_scaling(
        name,
        wanted,
        sts,
        instance_pods(ac, namespace, name) if pods is None else pods,
        instance_pvcs(ac, namespace, name),
        read_lease(ac, namespace, lease_name(name)),
    )
    if plan.deletes and leadership.may_act():
        if plan.delete_lease:
            delete(ac, "Lease", namespace, lease_name(name))
        for claim in plan.delete_claims:
            delete(ac, "PersistentVolumeClaim", namespace, claim)
        kopf.info(ds, reason="ScaledToOne", message=scaling.cleaned_message(name, plan))
        _periodic.due(namespace, name)  # a waiting scale-up goes on in the next round
    return plan


def _prune_rendered(ac: client.ApiClient, ds: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    """Delete what this DurableStream owns but no longer renders (a disabled ServiceMonitor)."""
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
    for kind, name in stale_objects(live, rendered, meta["uid"]):
        if delete(ac, kind, meta["namespace"], name):
            kopf.info(ds, reason="Deleted", message=f"deleted {kind} {name}: no longer rendered")


def _grow_volumes(ac: client.ApiClient, ds: dict[str, Any], size: str) -> Outcome:
    """Ask for ``size`` on the smaller PVCs whose StorageClass allows growth; say if any cannot."""
    meta = ds["metadata"]
    smaller = smaller_pvcs(instance_pvcs(ac, meta["namespace"], meta["name"]), size, quantity_bytes)
    if not smaller:
        return Outcome()
    names = {(p.get("spec") or {}).get("storageClassName") or "" for p in smaller} - {""}
    plan = plan_expansion(smaller, {cls: storage_class(ac, cls) for cls in sorted(names)})
    for pvc in plan.grow:
        grow_pvc(ac, meta["namespace"], pvc, size)
    if plan.grow:
        kopf.info(
            ds, reason="Expanding", message=f"storage {size} requested for {', '.join(plan.grow)}"
        )
    if plan.blocked:
        message = plan.message(size)
        kopf.warn(ds, reason="ExpansionNotAllowed", message=message)
        return Outcome("ExpansionNotAllowed", message)
    return Outcome()


def _apply_and_tell(ac: client.ApiClient, obj: dict[str, Any], ds: dict[str, Any]) -> None:
    outcome, drift = apply(ac, obj)
    if outcome == "unchanged":
        return
    what = f"{outcome} {obj['kind']} {obj['metadata']['name']}"
    if outcome == "corrected":
        kopf.warn(ds, reason="DriftCorrected", message=f"{what} (changed: {', '.join(drift)})")
    else:
        kopf.info(ds, reason=outcome.capitalize(), message=what)


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
    if not replicated(spec):
        return wanted, analytics_condition(scheduled=wanted)
    # A replica set: one in-sync standby's volume (analytics_source.py).
    view = lease_view(read_lease(ac, namespace, lease_name(name)))
    selector = {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "analytics"}
    current = [
        int(r)
        for obj in list_labelled(ac, "ScheduledSparkApplication", namespace, selector)
        if (
            r := (obj["metadata"].get("labels") or {}).get("streams.pyds.dev/replica", "")
        ).isdigit()
    ]
    source = choose_source(name, int(with_defaults(spec)["replicas"]), view, current)
    if source.replica is None:
        return None, analytics_condition(waiting=source.waiting)
    wanted = render_scheduled_applications(
        name, namespace, uid, spec, replicas=[source.replica], hold=source.waiting is not None
    )
    if source.waiting is not None:
        return wanted, analytics_condition(waiting=source.waiting)
    return wanted, analytics_condition(scheduled=wanted, source=f"{name}-{source.replica}")


def _reconcile_analytics(
    ac: client.ApiClient, name: str, namespace: str, uid: str, spec: dict, body: dict[str, Any]
) -> list[dict[str, Any]]:
    """Keep the ScheduledSparkApplications ``spec.analytics`` asks for; returns its condition.

    Analytics is optional and separate: a spec it cannot carry out (or a cluster
    without the Spark Operator) is reported in its own condition and leaves the
    stream servers, and the jobs already scheduled, as they are.
    """
    wanted, cond = _analytics(ac, name, namespace, uid, spec)
    if cond and cond[0]["reason"] == "InvalidAnalytics":
        kopf.warn(body, reason="InvalidAnalytics", message=cond[0]["message"])
    if (
        cond
        and cond[0]["reason"] == "NoStandbyInSync"
        and not any(
            c.get("reason") == "NoStandbyInSync"
            for c in (body.get("status") or {}).get("conditions") or []
        )
    ):
        kopf.warn(body, reason="NoStandbyInSync", message=cond[0]["message"])
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
    ds: dict[str, Any],
    sts: dict[str, Any] | None,
    outcome: Outcome | None,
    extra: list[dict[str, Any]],
) -> dict[str, Any]:
    """The status to write; a replica set's rolling update takes its next step here."""
    meta = ds["metadata"]
    spec = dict(ds.get("spec") or {})
    # The pods say why a server is not ready (crash loop, OOM); the claims, whether
    # every volume already holds the spec's size (issue 15, findings 4, 7, 8).
    name, namespace = meta["name"], meta["namespace"]
    pods = instance_pods(api(), namespace, name) if sts is not None else []
    lease = None
    step = None
    pods = lifecycle_actions.fence_pods(api(), ds, pods)
    if sts is not None and (plan := _scaling(api(), ds, sts, pods)).waiting:
        step = Step(plan.reason, plan.waiting)
        if plan.reason == scaling.SCALING_DOWN:
            _periodic.due(namespace, name)  # its second step is applied by a reconcile
    if sts is not None and replicated(spec) and step is None:
        lease = read_lease(api(), namespace, lease_name(name))
        pods = replica_set.label_roles(api(), namespace, pods, lease)
        if not lifecycle.holds_rollout(ds, pods):
            step = replica_set.roll(api(), ds, sts, pods, lease)
        if step is not None and step.switchover is not None:
            # The Lease names the new primary: label it and report it in this round.
            lease = read_lease(api(), namespace, lease_name(name))
            pods = replica_set.label_roles(api(), namespace, pods, lease)
    status = server_image.status_fields(ds, sts) | compute_status(
        spec=spec,
        generation=meta.get("generation"),
        statefulset=sts,
        endpoint=endpoint(name, namespace, spec),
        outcome=outcome,
        previous=dict(ds.get("status") or {}),
        extra=[*extra, *_certificates(spec, name)],
        pods=pods,
        pvcs=instance_pvcs(api(), namespace, name) if sts is not None else [],
        lease=lease,
        rollout=step,
    )
    return lifecycle_actions.observed(ds, sts, pods, status)


def _certificates(spec: dict[str, Any], name: str) -> list[dict[str, str]]:
    """The Certificates condition, computed afresh each round as Analytics is."""
    if issuer_ref(spec) is None:
        return []
    return certificates_condition(name, spec, crd_exists(api(), "Certificate"))


def _write(ac: client.ApiClient, ds: dict[str, Any], new: dict[str, Any]) -> None:
    """Write the status only when it says something new (no churn, no watch events)."""
    meta = ds["metadata"]
    metrics.CONDITION_COUNTS.observe(meta["namespace"], meta["name"], new.get("conditions") or [])
    if not leadership.may_act():
        return  # the Lease was lost during this reconcile: the new leader writes it
    replica_set.tell_primary_change(ds, dict(ds.get("status") or {}), new)
    available = new.get("imageUpdateAvailable")
    if available and available != (ds.get("status") or {}).get("imageUpdateAvailable"):
        message = server_image.update_message(meta["name"], new.get("image") or "", available)
        kopf.info(ds, reason="ServerImageUpdateAvailable", message=message)
    if not same_status(new, dict(ds.get("status") or {})):
        write_status(ac, meta["namespace"], meta["name"], new)


def refresh_status(name: str, namespace: str) -> None:
    """The pods' side of the status; the last reconcile's outcome stands as it was. A
    lifecycle annotation that needs an apply (a resume, hibernation) converges instead."""
    if _refresh_status(name, namespace):
        converge(name, namespace, logging.getLogger("stream_operator.lifecycle"))


def _refresh_status(name: str, namespace: str) -> bool:
    """The status round; True when the object must converge instead."""
    ac = api()
    if not leadership.may_act():
        return False
    with _lock(namespace, name):
        ds = read(ac, KIND, namespace, name)
        if ds is None or ds["metadata"].get("deletionTimestamp"):
            return False
        if lifecycle.paused(ds):
            lifecycle_actions.hold(ac, ds)
            return False
        uid, spec = ds["metadata"]["uid"], dict(ds.get("spec") or {})
        sts = read(ac, "StatefulSet", namespace, name)
        if lifecycle.wants_converge(ds, sts):
            return True
        if replicated(spec) and (spec.get("analytics") or {}).get("enabled"):
            # A replica set's jobs follow the Lease: an in-sync standby, never the primary.
            analytics = _reconcile_analytics(ac, name, namespace, uid, spec, ds)
        else:
            analytics = _analytics(ac, name, namespace, uid, spec)[1]
        was_missing = any(
            c.get("type") == "Analytics" and c.get("reason") == "SparkOperatorMissing"
            for c in (ds.get("status") or {}).get("conditions") or []
        )
        if was_missing and analytics and analytics[0]["reason"] == "Scheduled":
            # The Spark Operator was installed after the spec asked for analytics.
            analytics = _reconcile_analytics(ac, name, namespace, uid, spec, ds)
        _write(ac, ds, _observed(ds, sts, None, analytics))
    return False


def _deletes_pvcs(spec: kopf.Spec, **_: Any) -> bool:
    return bool(with_defaults(dict(spec))["storage"]["pvcRetention"] == "Delete")


# Only objects whose claims go with them get the finalizer (kopf adds it for a matching
# delete handler and removes it when the spec no longer matches): with Retain there is
# nothing to do at deletion (owned objects go by garbage collection).
@kopf.on.delete(GROUP, VERSION, PLURAL, when=_deletes_pvcs)
def cleanup(name: str, namespace: str, logger: logging.Logger, **_: Any) -> None:
    """Owned objects go by garbage collection; the PVCs go here (pvcRetention: Delete)."""
    if not leadership.may_act():
        raise kopf.TemporaryError("this operator does not hold the lease", delay=10)
    deleted = delete_pvcs(api(), namespace, name)
    logger.info("deleted PVCs %s", deleted)
