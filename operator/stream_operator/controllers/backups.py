"""DurableStreamBackup: an on-demand base backup of a DurableStream, as CloudNativePG's
Backup resource.

Created by a user (``kubectl dstream backup NAME``) or by the schedule in
``spec.backup.schedule`` (``scheduled``); the handler takes it once: it picks the pod
(an in-sync standby unless ``target: primary``; archive_pods.py), writes ``running``,
asks that pod's server for the backup (``POST /_archive/backups``, which answers once
the snapshot is in the object store), and writes ``completed`` with the backup's id
and lsn range, or ``failed`` with the reason. A backup is never retried: a failed one
stays failed (as CloudNativePG's), and the next scheduled one is a new object. A
backup found ``running`` when the operator starts was cut off by a restart: its
outcome is unknown to the operator, so it is marked failed, saying so (the server
finishes or drops it; ``durable-streams-server backups list`` shows what is there).

Each step is an Event on the backup; the DurableStream gets an Event and its status
``lastSuccessfulBackup`` and ``firstRecoverabilityPoint`` (from the server's backup
list, which retention has just pruned) when one completes.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from stream_operator import GROUP, KIND, VERSION
from stream_operator.api.spec import spec_of
from stream_operator.controllers.archive_pods import access, choose_backup_pod
from stream_operator.decisions.replica_roles import lease_view
from stream_operator.kube import archive_call, events
from stream_operator.kube.apply import MERGE_PATCH, instance_pods, read, read_lease, write_status
from stream_operator.specs.render import lease_name

BACKUP_KIND = "DurableStreamBackup"
BACKUP_PLURAL = "durablestreambackups"
CLUSTER_LABEL = f"{GROUP}/cluster"
PENDING, RUNNING, COMPLETED, FAILED = "pending", "running", "completed", "failed"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_backup_status(
    ac: client.ApiClient, namespace: str, name: str, status: dict[str, Any]
) -> None:
    client.CustomObjectsApi(ac).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        BACKUP_PLURAL,
        name,
        {"status": status},
        _content_type=MERGE_PATCH,
    )


def take(ac: client.ApiClient, backup: Mapping[str, Any]) -> dict[str, Any]:
    """Carry the backup out (or say why not); the status written last."""
    meta = backup["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    phase = (backup.get("status") or {}).get("phase") or PENDING
    if phase in (COMPLETED, FAILED):
        return dict(backup.get("status") or {})
    if phase == RUNNING:
        return _fail(
            ac,
            backup,
            "the operator restarted while this backup ran: its outcome is unknown "
            "(durable-streams-server backups list shows the backups in the store)",
        )
    cluster = str((backup.get("spec") or {}).get("cluster") or "")
    ds = read(ac, KIND, namespace, cluster)
    if ds is None:
        return _fail(ac, backup, f"no DurableStream {cluster} in {namespace}")
    spec = spec_of(ds)
    if spec.replica.enabled:
        return _fail(ac, backup, f"{cluster} is a replica cluster: back its source up instead")
    if spec.backup is None:
        return _fail(ac, backup, f"{cluster} has no spec.backup: no object store to back up to")
    target = str((backup.get("spec") or {}).get("target") or spec.backup.target)
    lease = read_lease(ac, namespace, lease_name(cluster)) if spec.replicated else None
    choice = choose_backup_pod(
        cluster, spec.replicated, lease_view(lease), instance_pods(ac, namespace, cluster), target
    )
    if not choice.pod:
        return _fail(ac, backup, f"no pod to take the backup on: {choice.why}")
    started = {"phase": RUNNING, "startedAt": _now(), "pod": choice.pod, "error": None}
    write_backup_status(ac, namespace, name, started)
    events.info(backup, reason="Starting", message=f"backup on {choice.pod} ({choice.role})")
    how = access(ac, ds, spec, choice.pod)
    reply = archive_call.request_backup(how.origin, how.token, verify=how.verify)
    if not reply.ok:
        return _fail(ac, backup, f"{choice.pod} answered {reply.why}", started)
    done = {
        **started,
        "phase": COMPLETED,
        "backupID": str(reply.body.get("id") or ""),
        "beginLSN": int(reply.body.get("start_lsn") or 0),
        "endLSN": int(reply.body.get("end_lsn") or 0),
        "stoppedAt": str(reply.body.get("stopped") or _now()),
    }
    if reply.body.get("started"):
        done["startedAt"] = str(reply.body["started"])
    write_backup_status(ac, namespace, name, done)
    message = f"backup {done['backupID']} (lsn {done['beginLSN']}-{done['endLSN']}) on {choice.pod}"
    events.info(backup, reason="Completed", message=message)
    events.info(ds, reason="BackupCompleted", message=f"{name}: {message}")
    _tell_cluster(ac, ds, spec, choice.pod, done)
    return done


def _tell_cluster(
    ac: client.ApiClient, ds: dict[str, Any], spec: Any, pod: str, done: Mapping[str, Any]
) -> None:
    """The DurableStream's lastSuccessfulBackup, and its firstRecoverabilityPoint as the
    server lists it after retention pruned (left as it was when the list fails)."""
    meta = ds["metadata"]
    fields: dict[str, Any] = {
        "lastSuccessfulBackup": done["stoppedAt"],
        "lastSuccessfulBackupID": done["backupID"],
    }
    how = access(ac, ds, spec, pod)
    listed = archive_call.list_backups(how.origin, how.token, verify=how.verify)
    recoverable = listed.body.get("recoverable") if listed.ok else None
    if isinstance(recoverable, dict) and recoverable.get("first_time"):
        fields["firstRecoverabilityPoint"] = str(recoverable["first_time"])
    write_status(ac, meta["namespace"], meta["name"], fields)


def _fail(
    ac: client.ApiClient,
    backup: Mapping[str, Any],
    why: str,
    started: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    meta = backup["metadata"]
    status = {**(started or {}), "phase": FAILED, "error": why, "stoppedAt": _now()}
    write_backup_status(ac, meta["namespace"], meta["name"], status)
    events.warn(backup, reason="Failed", message=why)
    return status


def render_backup(
    cluster: str, namespace: str, uid: str, name: str, target: str | None = None
) -> dict[str, Any]:
    """A DurableStreamBackup of ``cluster`` (owned by it when ``uid`` is given: a
    scheduled one goes with its DurableStream, as CloudNativePG's backupOwnerReference)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {CLUSTER_LABEL: cluster},
    }
    if uid:
        meta["ownerReferences"] = [
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": cluster, "uid": uid}
        ]
    spec: dict[str, Any] = {"cluster": cluster}
    if target:
        spec["target"] = target
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": BACKUP_KIND, "metadata": meta, "spec": spec}


def create_backup(ac: client.ApiClient, backup: dict[str, Any]) -> bool:
    """Create ``backup``; False when one of its name exists (a schedule's time is in the
    name, so a second round or operator at the same time makes no second backup)."""
    meta = backup["metadata"]
    try:
        client.CustomObjectsApi(ac).create_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], BACKUP_PLURAL, backup
        )
    except client.ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True
