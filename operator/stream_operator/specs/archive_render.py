"""What ``spec.backup``, ``spec.replica`` and ``spec.bootstrap.recovery`` add to the pods.

Pure functions of the parsed spec, called by render.py:

- the server's archive settings as DS_* variables for the ConfigMap (never a
  credential: those are ``secretKeyRef`` entries in the container's env, read by the
  kubelet from the user's Secret, so the operator never reads them);
- the archive the server talks to (``served_store``): a replica cluster
  (``replica.enabled``) follows its source's archive and archives nothing of its own;
  promoted (``enabled: false``), it renders its own ``spec.backup`` again;
- the store's CA bundle, a Secret key mounted as a file;
- the restore init container of ``bootstrap.recovery``: on the first pod only, and only
  while its volume is empty (the other pods copy from the primary, as a new replica
  does); a pod that holds data starts from it, so a restart never restores again.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any

from stream_operator.api.archive_spec import ObjectStore
from stream_operator.api.spec import DurableStreamSpec

ARCHIVE_CA_DIR = "/etc/durable-streams/archive-ca"
RECOVERY_CA_DIR = "/etc/durable-streams/recovery-ca"
CA_FILE = "ca.crt"
RESTORE_CONTAINER = "restore"


def served_store(spec: DurableStreamSpec) -> ObjectStore | None:
    """The archive the servers use: the source followed by a replica cluster, else this
    set's own (None: no archive)."""
    if spec.replica.enabled and spec.replica.source is not None:
        return spec.replica.source
    return spec.backup.object_store if spec.backup is not None else None


def archive_env(spec: DurableStreamSpec) -> dict[str, str]:
    """The archive's DS_* variables (none without an archive: the ConfigMap of a spec
    without ``backup`` or ``replica`` is what it always was)."""
    store = served_store(spec)
    if store is None:
        return {}
    env = {"DS_ARCHIVE_URL": store.destination_path}
    if store.endpoint_url:
        env["DS_ARCHIVE_ENDPOINT"] = store.endpoint_url
    if store.endpoint_ca is not None:
        env["DS_ARCHIVE_CA_BUNDLE"] = f"{ARCHIVE_CA_DIR}/{CA_FILE}"
    b = spec.backup
    if b is not None and b.archive_timeout_seconds is not None:
        env["DS_ARCHIVE_TIMEOUT"] = f"{b.archive_timeout_seconds:g}"
    if spec.replica.enabled:
        env["DS_ARCHIVE_FOLLOW"] = "true"
        return env
    if b is not None and b.archive_mode:
        env["DS_ARCHIVE_MODE"] = b.archive_mode
    if b is not None and b.retention_policy:
        env["DS_BACKUP_RETENTION"] = b.retention_policy
    return env


def credential_env(store: ObjectStore | None) -> list[dict[str, Any]]:
    """``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_REGION`` from the user's
    Secret (none given: the pod's own credentials, as boto3's chain finds them)."""
    creds = store.credentials if store is not None else None
    if creds is None:
        return []
    pairs = [
        ("AWS_ACCESS_KEY_ID", creds.access_key_id),
        ("AWS_SECRET_ACCESS_KEY", creds.secret_access_key),
    ]
    if creds.region is not None:
        pairs.append(("AWS_REGION", creds.region))
    return [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": sel.name, "key": sel.key}}}
        for var, sel in pairs
    ]


def _ca_volume(volume: str, store: ObjectStore) -> dict[str, Any]:
    assert store.endpoint_ca is not None
    items = [{"key": store.endpoint_ca.key, "path": CA_FILE}]
    return {"name": volume, "secret": {"secretName": store.endpoint_ca.name, "items": items}}


def server_volumes(spec: DurableStreamSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The served store's CA bundle as (volumes, the server container's mounts)."""
    store = served_store(spec)
    if store is None or store.endpoint_ca is None:
        return [], []
    mount = {"name": "archive-ca", "mountPath": ARCHIVE_CA_DIR, "readOnly": True}
    return [_ca_volume("archive-ca", store)], [mount]


def config_fields(spec: DurableStreamSpec) -> dict[str, Any]:
    """What of the archive is rendered into the pods, for the config hash (nothing
    without an archive, so every existing hash stays: no pod restarts on the upgrade).
    A schedule or backup target is the operator's alone and restarts no pod."""
    store = served_store(spec)
    if store is None and spec.recovery is None:
        return {}
    rendered = {"env": archive_env(spec), "credentials": credential_env(store)}
    if spec.recovery is not None:
        rendered["recovery"] = restore_command(spec, "")
    return {"archive": hashlib.sha256(json.dumps(rendered, sort_keys=True).encode()).hexdigest()}


def restore_command(spec: DurableStreamSpec, first_pod: str) -> str:
    """The init container's shell: restore into /data on ``first_pod`` when /data holds
    nothing (a new volume; ext4's lost+found aside), else nothing."""
    rec = spec.recovery
    assert rec is not None
    args = ["durable-streams-server", "restore", "--archive-url", rec.source.destination_path]
    if rec.source.endpoint_url:
        args += ["--archive-endpoint", rec.source.endpoint_url]
    args += ["--data-dir", "/data"]
    if rec.backup_id:
        args += ["--backup", rec.backup_id]
    if rec.target.target_time:
        args += ["--target-time", rec.target.target_time]
    if rec.target.target_lsn is not None:
        args += ["--target-lsn", str(rec.target.target_lsn)]
    return "\n".join(
        [
            "set -eu",
            f'if [ "$POD_NAME" != {shlex.quote(first_pod)} ]; then',
            '  echo "$POD_NAME copies its data from the primary: no restore"; exit 0',
            "fi",
            "if [ -n \"$(ls -A /data | grep -v '^lost+found$' || true)\" ]; then",
            '  echo "/data holds data: no restore"; exit 0',
            "fi",
            "exec " + " ".join(shlex.quote(a) for a in args),
        ]
    )


def restore_init_container(
    name: str, spec: DurableStreamSpec, server: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The restore init container and its volumes (none without ``bootstrap.recovery``).
    ``server``: the server container, whose image, resources and security it shares."""
    rec = spec.recovery
    if rec is None:
        return [], []
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *credential_env(rec.source),
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "data", "mountPath": "/data"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = []
    if rec.source.endpoint_ca is not None:
        volumes.append(_ca_volume("recovery-ca", rec.source))
        mounts.append({"name": "recovery-ca", "mountPath": RECOVERY_CA_DIR, "readOnly": True})
        env.append({"name": "DS_ARCHIVE_CA_BUNDLE", "value": f"{RECOVERY_CA_DIR}/{CA_FILE}"})
    container: dict[str, Any] = {
        "name": RESTORE_CONTAINER,
        "image": server["image"],
        "imagePullPolicy": server["imagePullPolicy"],
        "command": ["/bin/sh", "-c", restore_command(spec, f"{name}-0")],
        "env": env,
        "resources": server["resources"],
        "volumeMounts": mounts,
        "securityContext": server["securityContext"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return [container], volumes
