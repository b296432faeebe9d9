"""Idempotent apply: create what is missing, patch what differs, leave the rest alone.

One module over 400 lines, kept whole: the kinds it knows, the write of one object
and the pruning of what is no longer rendered are one procedure over one table.

An object is written only when the live one no longer holds what the
operator renders (``plan.drifted_fields``, which compares as the API server
stores: canonical quantities, defaults and injected sidecars are not drift),
so resuming after an operator
restart, or a periodic resync, touches nothing that is already as it should
be, and a hand edit of a rendered field is put back. Each applied object
carries a hash of what was rendered, which tells a new rendering (patched)
from a hand edit (corrected). Writes are server-side apply (forced, one
field manager), creates included: the operator owns every field it renders,
and a field it stops rendering is removed.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import GROUP, PLURAL, VERSION
from stream_operator.decisions.plan import drifted_fields
from stream_operator.kube import object_cache
from stream_operator.kube.object_cache import UNKNOWN

APPLIED_HASH = f"{GROUP}/applied-hash"
FIELD_MANAGER = "durable-streams-operator"
MERGE_PATCH = "application/merge-patch+json"

# kind -> (api class, read, create, patch) method names
_TYPED = {
    "ConfigMap": (client.CoreV1Api, "config_map"),
    "Service": (client.CoreV1Api, "service"),
    "StatefulSet": (client.AppsV1Api, "stateful_set"),
    "PodDisruptionBudget": (client.PolicyV1Api, "pod_disruption_budget"),
    "ServiceAccount": (client.CoreV1Api, "service_account"),
    "Role": (client.RbacAuthorizationV1Api, "role"),
    "RoleBinding": (client.RbacAuthorizationV1Api, "role_binding"),
    "NetworkPolicy": (client.NetworkingV1Api, "network_policy"),
    # Read or deleted, never rendered: the servers' Lease, a Secret's key, a pod to roll.
    "Lease": (client.CoordinationV1Api, "lease"),
    "Secret": (client.CoreV1Api, "secret"),
    "Pod": (client.CoreV1Api, "pod"),
    "PersistentVolumeClaim": (client.CoreV1Api, "persistent_volume_claim"),
}
_CUSTOM = {
    "DurableStream": (GROUP, VERSION, PLURAL),
    "PodMonitor": ("monitoring.coreos.com", "v1", "podmonitors"),
    "Certificate": ("cert-manager.io", "v1", "certificates"),
    "ScheduledSparkApplication": ("sparkoperator.k8s.io", "v1beta2", "scheduledsparkapplications"),
}


def object_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _stamped(obj: dict[str, Any]) -> dict[str, Any]:
    stamped: dict[str, Any] = json.loads(json.dumps(obj))
    stamped["metadata"].setdefault("annotations", {})[APPLIED_HASH] = object_hash(obj)
    return stamped


def _plain(api_client: client.ApiClient, obj: object) -> dict[str, Any]:
    """A client model as the JSON object the API server sent."""
    plain: dict[str, Any] = api_client.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return plain


def _custom_objects(api_client: client.ApiClient) -> Any:
    """The custom objects API: it answers JSON objects, which the client types as object."""
    return client.CustomObjectsApi(api_client)


def _body(obj: dict[str, Any]) -> Any:
    """A plain dict where the client's create methods name a model: they take either."""
    return obj


def read(
    api_client: client.ApiClient, kind: str, namespace: str, name: str
) -> dict[str, Any] | None:
    """The object, or None; a status round's StatefulSet and Lease from the watch-fed
    cache once it answers (``object_cache``)."""
    cache = object_cache.reads_of(api_client)
    if cache is not None and (cached := cache.get(kind, namespace, name)) is not UNKNOWN:
        return cast("dict[str, Any] | None", cached)
    try:
        if kind in _CUSTOM:
            group, version, plural = _CUSTOM[kind]
            found = _custom_objects(api_client).get_namespaced_custom_object(
                group, version, namespace, plural, name
            )
            return cast(dict[str, Any], found)
        api_cls, noun = _TYPED[kind]
        obj = getattr(api_cls(api_client), f"read_namespaced_{noun}")(name, namespace)
        return _plain(api_client, obj)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def apply(api_client: client.ApiClient, obj: dict[str, Any]) -> tuple[str, list[str]]:
    """Make ``obj`` exist as rendered.

    Returns the outcome ("created", "patched": a new rendering, "corrected": a
    hand edit undone, "unchanged") and the fields that differed.
    """
    kind = obj["kind"]
    name = obj["metadata"]["name"]
    namespace = obj["metadata"]["namespace"]
    desired = _stamped(obj)
    live = read(api_client, kind, namespace, name)
    if live is None:
        # Created by server-side apply too, so that the operator's field manager owns
        # every field from the start (and can drop a field by no longer sending it).
        _patch(api_client, kind, namespace, name, desired)
        return "created", []
    if kind == "StatefulSet":
        # These fields cannot change after creation; volumes grow by patching the PVCs.
        for field in ("volumeClaimTemplates", "selector", "serviceName", "podManagementPolicy"):
            if field in (live.get("spec") or {}):
                desired["spec"][field] = live["spec"][field]
    drift = drifted_fields(desired, live)
    if not drift:
        return "unchanged", []
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    rerendered = annotations.get(APPLIED_HASH) != desired["metadata"]["annotations"][APPLIED_HASH]
    _patch(api_client, kind, namespace, name, desired)
    return ("patched" if rerendered else "corrected"), drift


def _patch(
    api_client: client.ApiClient, kind: str, namespace: str, name: str, body: dict[str, Any]
) -> None:
    """Server-side apply, forced: fields the operator stops rendering are removed."""
    options: dict[str, Any] = {
        "field_manager": FIELD_MANAGER,
        "force": True,
        "_content_type": "application/apply-patch+yaml",
    }
    if kind in _CUSTOM:
        group, version, plural = _CUSTOM[kind]
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            group, version, namespace, plural, name, body, **options
        )
        return
    api_cls, noun = _TYPED[kind]
    getattr(api_cls(api_client), f"patch_namespaced_{noun}")(name, namespace, body, **options)


def _ordinal_items(
    api_client: client.ApiClient,
    kind: str,
    list_namespaced: Callable[..., Any],
    namespace: str,
    prefix: str,
    labels: dict[str, str],
) -> list[dict[str, Any]]:
    """The items named ``<prefix><ordinal>`` that carry all of ``labels``, as plain dicts
    (a status round's from the watch-fed cache once it answers, ``object_cache``).

    Filters again after the label selector: not every API server (or emulator) honours
    label selectors."""

    def wanted(raw: dict[str, Any]) -> bool:
        item_name = raw["metadata"]["name"]
        have = raw["metadata"].get("labels") or {}
        return (
            item_name.startswith(prefix)
            and item_name[len(prefix) :].isdigit()
            and all(have.get(k) == v for k, v in labels.items())
        )

    cache = object_cache.reads_of(api_client)
    cached = cache.items(kind, namespace, wanted) if cache is not None else UNKNOWN
    if isinstance(cached, list):
        return cached
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    items = list_namespaced(namespace, label_selector=selector).items
    return [raw for raw in (_plain(api_client, item) for item in items) if wanted(raw)]


def instance_pvcs(api_client: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The PVCs of a DurableStream's pods (``data-<name>-<ordinal>``)."""
    core = client.CoreV1Api(api_client)
    return _ordinal_items(
        api_client,
        "PersistentVolumeClaim",
        core.list_namespaced_persistent_volume_claim,
        namespace,
        f"data-{name}-",
        {"app.kubernetes.io/instance": name},
    )


def instance_pods(api_client: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The server pods of a DurableStream (``<name>-<ordinal>``), for their container states.

    The name label keeps out Spark pods of the same instance."""
    core = client.CoreV1Api(api_client)
    labels = {"app.kubernetes.io/instance": name, "app.kubernetes.io/name": "durable-streams"}
    return _ordinal_items(
        api_client, "Pod", core.list_namespaced_pod, namespace, f"{name}-", labels
    )


def grow_pvc(api_client: client.ApiClient, namespace: str, name: str, size: str) -> None:
    client.CoreV1Api(api_client).patch_namespaced_persistent_volume_claim(
        name,
        namespace,
        {"spec": {"resources": {"requests": {"storage": size}}}},
        _content_type=MERGE_PATCH,
    )


def storage_class(api_client: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        sc = client.StorageV1Api(api_client).read_storage_class(name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return _plain(api_client, sc)


def write_status(
    api_client: client.ApiClient, namespace: str, name: str, status: dict[str, Any]
) -> None:
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _content_type=MERGE_PATCH
    )


def remove_annotation(api_client: client.ApiClient, namespace: str, name: str, key: str) -> None:
    """Remove one annotation from a DurableStream (a merge patch with null)."""
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"metadata": {"annotations": {key: None}}},
        _content_type=MERGE_PATCH,
    )


def delete_pvcs(api_client: client.ApiClient, namespace: str, name: str) -> list[str]:
    core = client.CoreV1Api(api_client)
    deleted = []
    for pvc in instance_pvcs(api_client, namespace, name):
        try:
            core.delete_namespaced_persistent_volume_claim(pvc["metadata"]["name"], namespace)
            deleted.append(pvc["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise
    return deleted


def crd_exists(api_client: client.ApiClient, kind: str) -> bool:
    """Whether the cluster serves ``kind`` (one of the custom kinds the operator may create)."""
    group, _, plural = _CUSTOM[kind]
    try:
        client.ApiextensionsV1Api(api_client).read_custom_resource_definition(f"{plural}.{group}")
        return True
    except ApiException as exc:
        if exc.status in (403, 404):
            return False
        raise


# What the operator renders for a DurableStream, and so may have to delete again.
RENDERED_KINDS = (
    "ConfigMap",
    "NetworkPolicy",
    "Service",
    "PodDisruptionBudget",
    "StatefulSet",
    "PodMonitor",
    "Certificate",
    "ServiceAccount",
    "Role",
    "RoleBinding",
)


def list_labelled(
    api_client: client.ApiClient, kind: str, namespace: str, selector: dict[str, str]
) -> list[dict[str, Any]]:
    """The ``kind`` objects that carry ``selector``'s labels ([] if the kind is not served)."""
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    try:
        if kind in _CUSTOM:
            group, version, plural = _CUSTOM[kind]
            items = _custom_objects(api_client).list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=label_selector
            )["items"]
        else:
            api_cls, noun = _TYPED[kind]
            listed = getattr(api_cls(api_client), f"list_namespaced_{noun}")(
                namespace, label_selector=label_selector
            )
            items = [_plain(api_client, o) for o in listed.items]
    except ApiException as exc:
        if exc.status == 404:  # a custom kind whose CRD is not installed
            return []
        raise
    out = []
    for obj in items:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        # Filter again: not every API server (or emulator) honours label selectors.
        if all(labels.get(k) == v for k, v in selector.items()):
            out.append({**obj, "kind": kind})  # list items carry no kind
    return out


def delete(api_client: client.ApiClient, kind: str, namespace: str, name: str) -> bool:
    """Delete one object; False if it was already gone."""
    try:
        if kind in _CUSTOM:
            group, version, plural = _CUSTOM[kind]
            client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
                group, version, namespace, plural, name
            )
        else:
            api_cls, noun = _TYPED[kind]
            getattr(api_cls(api_client), f"delete_namespaced_{noun}")(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def prune(
    api_client: client.ApiClient,
    kind: str,
    namespace: str,
    selector: dict[str, str],
    keep: set[str],
) -> list[str]:
    """Delete the ``kind`` objects matching ``selector`` whose names are not in ``keep``."""
    group, version, plural = _CUSTOM[kind]
    api = _custom_objects(api_client)
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    items = api.list_namespaced_custom_object(
        group, version, namespace, plural, label_selector=label_selector
    )["items"]
    deleted = []
    for obj in items:
        labels = obj["metadata"].get("labels") or {}
        name = obj["metadata"]["name"]
        # Filter again: not every API server (or emulator) honours label selectors.
        if name in keep or any(labels.get(k) != v for k, v in selector.items()):
            continue
        try:
            api.delete_namespaced_custom_object(group, version, namespace, plural, name)
            deleted.append(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return deleted


def read_lease(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """A replica set's Lease as the servers wrote it (None before the first one started)."""
    return read(api_client, "Lease", namespace, name)


def label_pod(
    api_client: client.ApiClient, namespace: str, name: str, labels: dict[str, str]
) -> None:
    client.CoreV1Api(api_client).patch_namespaced_pod(
        name, namespace, {"metadata": {"labels": labels}}, _content_type=MERGE_PATCH
    )


def set_pod_condition(
    api_client: client.ApiClient, namespace: str, name: str, condition: dict[str, str]
) -> None:
    """One condition of the pod's status, by a strategic merge patch: the conditions merge
    by type, so the kubelet's and everyone else's stay as they are."""
    client.CoreV1Api(api_client).patch_namespaced_pod_status(
        name,
        namespace,
        {"status": {"conditions": [condition]}},
        _content_type="application/strategic-merge-patch+json",
    )


def scale_statefulset(
    api_client: client.ApiClient, namespace: str, name: str, replicas: int
) -> None:
    """Set a StatefulSet's replicas alone (a merge patch; the next apply owns it again)."""
    client.AppsV1Api(api_client).patch_namespaced_stateful_set(
        name, namespace, {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH
    )


def annotate_pod(
    api_client: client.ApiClient, namespace: str, name: str, annotations: dict[str, str | None]
) -> None:
    """Set (or, with None, remove) annotations on a pod: a merge patch."""
    client.CoreV1Api(api_client).patch_namespaced_pod(
        name, namespace, {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH
    )


def read_secret_value(
    api_client: client.ApiClient, namespace: str, name: str, key: str
) -> str | None:
    """One key of a Secret, decoded (None: no such Secret or key)."""
    raw = ((read(api_client, "Secret", namespace, name) or {}).get("data") or {}).get(key)
    return base64.b64decode(raw).decode() if raw is not None else None


def create_secret(api_client: client.ApiClient, secret: dict[str, Any]) -> bool:
    """Create ``secret`` unless one of its name exists (never overwritten): True if created."""
    try:
        client.CoreV1Api(api_client).create_namespaced_secret(
            secret["metadata"]["namespace"], _body(secret)
        )
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def delete_pod(api_client: client.ApiClient, namespace: str, name: str) -> bool:
    """Delete one pod (its StatefulSet recreates it on the update revision); False if gone."""
    return delete(api_client, "Pod", namespace, name)
