"""``kubectl dstream promote NAME`` and ``kubectl dstream demote NAME --to OTHER``: the
one spec change each, as a user would make it with ``kubectl patch`` (the operator
carries it out: stream_operator.decisions.replica_cluster, docs/kubernetes.md "Backups and
recovery"). A merge patch of ``spec.replica`` against the resourceVersion read, so a
change made in between is not overwritten; the patches themselves are pure.
"""

from __future__ import annotations

import copy
from typing import Any, TextIO

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import GROUP, PLURAL, VERSION
from stream_operator.plugin import PluginError
from stream_operator.plugin.commands import MERGE_PATCH, TIMEOUT, _failed, read_stream

REFUSE, REBUILD = "Refuse", "Rebuild"


def promotion_patch(ds: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that promotes ``ds`` (a replica cluster): ``replica.enabled: false``,
    the source kept (it names the archive the promoted set must not write to)."""
    name = ds["metadata"]["name"]
    replica = (ds.get("spec") or {}).get("replica") or {}
    if not replica.get("enabled"):
        raise PluginError(f"{name} is not a replica cluster (spec.replica.enabled is not true)")
    backup = ((ds["spec"].get("backup") or {}).get("objectStore") or {}).get("destinationPath")
    source = (replica.get("source") or {}).get("destinationPath")
    if backup and source and backup.rstrip("/") == source.rstrip("/"):
        raise PluginError(
            f"{name}'s backup.objectStore is the archive it follows ({source}): give it an "
            "archive of its own before promoting it"
        )
    return {"spec": {"replica": {"enabled": False}}}


def demotion_patch(
    ds: dict[str, Any], new_primary: dict[str, Any], rebuild: bool
) -> dict[str, Any]:
    """The merge patch that demotes ``ds`` into a replica cluster of ``new_primary``'s
    archive (its ``spec.backup.objectStore``, copied whole: path, endpoint, credentials,
    CA). Refused for a set that already follows, a new primary that still follows, or one
    without an archive."""
    name, other = ds["metadata"]["name"], new_primary["metadata"]["name"]
    if ((ds.get("spec") or {}).get("replica") or {}).get("enabled"):
        raise PluginError(f"{name} is a replica cluster already")
    other_spec = new_primary.get("spec") or {}
    if (other_spec.get("replica") or {}).get("enabled"):
        raise PluginError(f"{other} is a replica cluster itself: promote it first")
    store = (other_spec.get("backup") or {}).get("objectStore")
    if not store:
        raise PluginError(f"{other} has no spec.backup.objectStore: no archive to follow")
    replica = {
        "enabled": True,
        "source": copy.deepcopy(store),
        "demotionPolicy": REBUILD if rebuild else REFUSE,
    }
    return {"spec": {"replica": replica}}


def _patch(api: client.ApiClient, ds: dict[str, Any], body: dict[str, Any]) -> None:
    meta = ds["metadata"]
    body = {**body, "metadata": {"resourceVersion": meta.get("resourceVersion")}}
    try:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            body,
            _content_type=MERGE_PATCH,
            _request_timeout=TIMEOUT,
        )
    except ApiException as exc:
        if exc.status == 409:
            raise PluginError(f"{meta['name']} changed meanwhile: run the command again") from None
        raise _failed(exc, f"patch DurableStream {meta['name']}") from None


def promote(api: client.ApiClient, namespace: str, name: str, out: TextIO) -> int:
    ds = read_stream(api, namespace, name)
    _patch(api, ds, promotion_patch(ds))
    out.write(
        f"durablestream/{name} patched spec.replica.enabled=false: the operator restarts its "
        "pods as writers (condition ReplicaCluster: Promoting, then Promoted)\n"
    )
    return 0


def demote(
    api: client.ApiClient, namespace: str, name: str, to: str, *, rebuild: bool, out: TextIO
) -> int:
    ds = read_stream(api, namespace, name)
    _patch(api, ds, demotion_patch(ds, read_stream(api, namespace, to), rebuild))
    then = (
        "deletes its volumes and restores the new archive's newest backup"
        if rebuild
        else "keeps its volumes and the set stopped (demotionPolicy Refuse)"
    )
    out.write(
        f"durablestream/{name} patched to follow {to}'s archive: the operator stops its pods, "
        f"then {then}\n"
    )
    return 0
