"""The kopf handlers: thin glue between kopf's events and the operator's work.

A reconcile (``reconcile.converge``) on create, update and resume; the periodic rounds
per object on a small pool of worker threads (``periodic``) over the DurableStreams an
event handler keeps track of: a status round (``status_round``) every
``DS_OPERATOR_STATUS_INTERVAL`` seconds, a whole reconcile every
``DS_OPERATOR_RESYNC_INTERVAL`` (``operator_settings``); and a delete
handler, only for ``pvcRetention: Delete``, that deletes the claims once the pods are
gone, and the Lease before them (``lifecycle_deletion``). The status rounds read the
operator's StatefulSets, pods, claims and Leases from watches (``kube.object_cache``),
started here and stopped at cleanup.

Not kopf timers: kopf puts its finalizer on every object that has a timer, and a
finalizer nobody removes (the operator uninstalled) makes ``kubectl delete`` hang. So an
object carries the finalizer only while its spec asks for ``pvcRetention: Delete``, the
one case where the operator has something to do before the object goes. Every API
request has a timeout (``DS_OPERATOR_API_TIMEOUT``), so no round waits forever on one.

Nothing is written unless ``leadership.may_act()``: with leader election on, a process
that lost the Lease (or could not renew it in time) writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf

from stream_operator import GROUP, PLURAL, VERSION
from stream_operator.api.spec import with_defaults
from stream_operator.configuration import operator_settings
from stream_operator.controllers import backups, operator_metrics
from stream_operator.controllers.lifecycle_deletion import finish
from stream_operator.controllers.periodic import Periodic
from stream_operator.controllers.reconcile import converge as _converge
from stream_operator.controllers.status_round import refresh
from stream_operator.decisions import server_image
from stream_operator.kube import leadership, object_cache
from stream_operator.kube.api_client import api, new_api_client


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    tuning = operator_settings.current()
    api_timeout = tuning.api_timeout
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    # kopf's own requests: a connection that never opens, or a request never answered,
    # fails and is retried instead of holding its handler (kopf's defaults: none, 5 min).
    settings.watching.connect_timeout = api_timeout
    settings.networking.connect_timeout = api_timeout
    settings.networking.request_timeout = 3 * api_timeout
    # The timers are short synchronous calls that end on their own: a deletion that
    # finds one running waits for it briefly, then checks every second, not every minute.
    settings.background.instant_exit_timeout = 0.5
    settings.background.cancellation_polling = 1.0
    # Watching given namespaces: no cluster-wide list/watch of namespaces and CRDs,
    # so that Roles in those namespaces (and a ClusterRole reading CRDs and
    # StorageClasses by name) are all the operator needs; the namespaces are taken as
    # named, and the DurableStream CRD must exist when the operator starts.
    settings.scanning.disabled = not settings.peering.clusterwide
    operator_metrics.restart()
    # What a status round reads of the operator's own objects, watched (object_cache): on
    # a client of its own, whose watches hold connections for minutes.
    watcher = new_api_client(api().configuration)
    watcher.user_agent = f"{api().user_agent} object-cache"
    object_cache.install(watcher)
    # The status every status_interval, a whole reconcile every resync_interval (drift: a
    # deleted Service, a hand-scaled StatefulSet, a StorageClass that now allows growth);
    # a worker on one object for stall_seconds is stuck (every call of a round has a
    # timeout far shorter): /healthz fails, and the kubelet restarts the operator.
    _periodic.start(
        tuning.status_interval,
        tuning.resync_interval,
        tuning.stall_seconds,
        workers=tuning.periodic_workers,
    )


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
    object_cache.uninstall()


Logger = logging.Logger | logging.LoggerAdapter[Any]  # what kopf hands its handlers


def converge(name: str, namespace: str | None, logger: Logger) -> None:
    """A whole reconcile of one DurableStream (``reconcile.converge``)."""
    _converge(api(), name, _namespaced(namespace), logger, _periodic)


def _namespaced(namespace: str | None) -> str:
    """The DurableStream's namespace: kopf types it optional for cluster-wide kinds."""
    if namespace is None:
        raise kopf.PermanentError("a DurableStream is namespaced: its event has no namespace")
    return namespace


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(name: str, namespace: str | None, logger: Logger, **_: Any) -> None:
    converge(name, namespace, logger)


@kopf.on.update(GROUP, VERSION, PLURAL, annotations={server_image.UPDATE_NOW: kopf.PRESENT})
def update_server_image(name: str, namespace: str | None, logger: Logger, **_: Any) -> None:
    """The owner asks for the operator's server image now (server_image.py, ``hold``)."""
    converge(name, namespace, logger)


@kopf.on.event(GROUP, VERSION, PLURAL)
def track(type: str, name: str, namespace: str | None, **_: Any) -> None:
    """Keep the set of DurableStreams the periodic work goes over (no finalizer needed)."""
    namespace = _namespaced(namespace)
    if type == "DELETED":
        _periodic.forget(namespace, name)
        operator_metrics.forget(namespace, name)
    else:
        operator_metrics.seen(namespace, name)
        if (cache := object_cache.current()) is not None:
            cache.watch(namespace)  # what its status rounds read (object_cache)
        _periodic.track(namespace, name)


def _round(namespace: str, name: str, resync: bool) -> None:
    """One object's periodic round: a whole reconcile when ``resync`` says it is due (or
    the status round finds a lifecycle annotation only an apply carries out), else a
    status round; an error that the next round may not see is logged, not raised."""
    log = logging.getLogger("stream_operator.controllers.periodic")
    try:
        if resync:
            converge(name, namespace, log)
        elif refresh(api(), name, namespace, _periodic):
            converge(name, namespace, logging.getLogger("stream_operator.decisions.lifecycle"))
    except kopf.TemporaryError as exc:
        log.warning("%s/%s: %s (next try in the next round)", namespace, name, exc)


_periodic = Periodic(_round)  # its workers: DS_OPERATOR_PERIODIC_WORKERS, at start


def _deletes_pvcs(spec: kopf.Spec, **_: Any) -> bool:
    return with_defaults(spec).storage.pvc_retention == "Delete"


# Only objects whose claims go with them get the finalizer (kopf adds it for a matching
# delete handler and removes it when the spec no longer matches): with Retain there is
# nothing to do at deletion (owned objects go by garbage collection).
@kopf.on.delete(GROUP, VERSION, PLURAL, when=_deletes_pvcs)
def cleanup(name: str, namespace: str | None, logger: Logger, **_: Any) -> None:
    """The pods, then the Lease, then the PVCs (pvcRetention: Delete; lifecycle_deletion):
    the rest goes by garbage collection once the finalizer is removed."""
    if not leadership.may_act():
        raise kopf.TemporaryError("this operator does not hold the lease", delay=10)
    waiting, deleted = finish(api(), _namespaced(namespace), name)
    if waiting:
        raise kopf.TemporaryError(waiting, delay=2)
    logger.info("deleted PVCs %s", deleted)


@kopf.on.resume(GROUP, VERSION, backups.BACKUP_PLURAL)
@kopf.on.create(GROUP, VERSION, backups.BACKUP_PLURAL)
def take_backup(body: kopf.Body, logger: Logger, **_: Any) -> None:
    """A DurableStreamBackup, taken once (backups.py); a finished one is left as it is."""
    if not leadership.may_act():
        raise kopf.TemporaryError("this operator does not hold the lease", delay=10)
    status = backups.take(api(), dict(body))
    logger.info("backup %s: %s", body["metadata"]["name"], status.get("phase"))
