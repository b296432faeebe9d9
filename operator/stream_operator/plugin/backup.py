"""``kubectl dstream backup NAME``: a DurableStreamBackup made now, and its outcome.

The plugin creates the object (as ``kubectl cnpg backup`` does) and the operator takes
the backup (stream_operator.controllers.backups, docs/kubernetes.md "Backups and recovery"); the
plugin waits for the backup's ``completed`` or ``failed`` and prints it. The object is
written here, not with stream_operator.controllers.backups: the plugin installs without kopf.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any, TextIO, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import GROUP, VERSION
from stream_operator.api.spec import spec_of
from stream_operator.plugin import PluginError
from stream_operator.plugin.commands import TIMEOUT, _failed, read_stream

BACKUP_PLURAL = "durablestreambackups"
CLUSTER_LABEL = f"{GROUP}/cluster"


def backup_object(namespace: str, cluster: str, name: str, target: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"cluster": cluster}
    if target:
        spec["target"] = target
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DurableStreamBackup",
        "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_LABEL: cluster}},
        "spec": spec,
    }


def backup(
    api: client.ApiClient,
    namespace: str,
    cluster: str,
    *,
    target: str | None,
    wait: bool,
    timeout: float,
    out: TextIO,
) -> int:
    """Create the backup; with ``wait``, 0 once completed, 1 if it failed or timed out."""
    spec = spec_of(read_stream(api, namespace, cluster))
    if spec.backup is None:
        raise PluginError(f"DurableStream {cluster} has no spec.backup: nowhere to back up to")
    if spec.replica.enabled:
        raise PluginError(f"{cluster} is a replica cluster: back its source up instead")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d%H%M%S")
    name = f"{cluster}-manual-{stamp}"
    custom = client.CustomObjectsApi(api)
    try:
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            BACKUP_PLURAL,
            backup_object(namespace, cluster, name, target),
            _request_timeout=TIMEOUT,
        )
    except ApiException as exc:
        raise _failed(exc, f"create DurableStreamBackup {name}") from exc
    print(f"durablestreambackup/{name} created", file=out)
    if not wait:
        return 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = cast(
                "dict[str, Any]",
                custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, BACKUP_PLURAL, name, _request_timeout=TIMEOUT
                ),
            )
        except ApiException as exc:
            raise _failed(exc, f"read DurableStreamBackup {name}") from exc
        status = found.get("status") or {}
        if status.get("phase") in ("completed", "failed"):
            print(json.dumps(status, indent=2, sort_keys=True), file=out)
            return 0 if status["phase"] == "completed" else 1
        time.sleep(1.0)
    print(f"no outcome after {timeout:g} s: kubectl get dsbackup {name}", file=out)
    return 1
