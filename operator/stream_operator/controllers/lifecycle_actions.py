"""The lifecycle annotations carried out (``lifecycle`` decides): a paused object's status
held, the fence written on the pods, and an Event for each change. Glue, like
``replica_set``: ``handlers`` calls it under the object's lock, with its API client (which
refuses writes once this operator lost its Lease).
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

from kubernetes import client

from stream_operator.decisions.lifecycle import (
    FENCED_INSTANCES,
    PAUSED_MESSAGE,
    POD_FENCED,
    RECONCILE,
    fence_changes,
    fenced_instances,
    lifecycle_status,
    paused_status,
    replicas_anyway,
    was_paused,
)
from stream_operator.decisions.status import same_status
from stream_operator.kube import events, leadership
from stream_operator.kube.apply import annotate_pod, apply, read, scale_statefulset, write_status
from stream_operator.specs.render import (
    FENCE_LIST_KEY,
    fence_configmap_name,
    render_fence_configmap,
)


def hold(ac: client.ApiClient, ds: dict[str, Any]) -> None:
    """A paused object: only its ``ReconcilePaused`` condition is written (an Event the
    first time)."""
    meta = ds["metadata"]
    previous = dict(ds.get("status") or {})
    if not leadership.may_act():
        return
    if not was_paused(previous):
        events.info(ds, reason="ReconcilePaused", message=PAUSED_MESSAGE)
    new = paused_status(previous)
    if not same_status(new, previous):
        write_status(ac, meta["namespace"], meta["name"], new)


def scale_anyway(ac: client.ApiClient, ds: dict[str, Any], sts: dict[str, Any] | None) -> None:
    """Hibernate (or wake) although the rest of the spec was refused: a refusal leaves
    the servers as they are, but stopping or starting them all changes no data."""
    replicas = replicas_anyway(ds, sts)
    if replicas is None or not leadership.may_act():
        return
    meta = ds["metadata"]
    scale_statefulset(ac, meta["namespace"], meta["name"], replicas)
    what = "hibernating" if replicas == 0 else "waking"
    events.info(
        ds,
        reason="Scaled",
        message=f"StatefulSet {meta['name']} to {replicas} replicas ({what}), the refused "
        "rest of the spec aside",
    )


def fence_pods(
    ac: client.ApiClient, ds: dict[str, Any], pods: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Write the fenced list into the ConfigMap the pods mount (a pod made later is fenced
    from its start), then ``streams.pyds.dev/fenced`` on the pods: ``"true"`` on those the
    fence names, ``"false"`` on the others that had it (the annotation, once there,
    decides over the list: an unfence does not wait for the kubelet to refresh the
    list's file). Returns the pods as annotated now. An unreadable fence annotation
    changes nothing (a Warning Event says why)."""
    fenced, error = fenced_instances(ds)
    if error is not None:
        reasons = [c.get("reason") for c in (ds.get("status") or {}).get("conditions") or []]
        if "InvalidFencedInstances" not in reasons:
            events.warn(ds, reason="InvalidFencedInstances", message=error)
        return pods
    if not leadership.may_act():
        return pods
    namespace = ds["metadata"]["namespace"]
    _write_list(ac, ds, fenced)
    changes = dict(fence_changes(fenced, pods))
    for pod, fence in sorted(changes.items()):
        annotate_pod(ac, namespace, pod, {POD_FENCED: "true" if fence else "false"})
        what = (
            "fenced: its server closes its storage and answers 503, not ready"
            if fence
            else "unfenced: its server starts again on its storage"
        )
        events.info(ds, reason="Fenced" if fence else "Unfenced", message=f"pod {pod} {what}")
    return [_annotated(p, changes) for p in pods]


def _write_list(ac: client.ApiClient, ds: dict[str, Any], fenced: frozenset[str]) -> None:
    """The ConfigMap ``<name>-fence`` holding ``fenced`` (made the first time a pod is
    fenced, kept, emptied, once there), read by a status round only when the list
    changed (``_fence_lists``)."""
    meta = ds["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    body = render_fence_configmap(name, namespace, meta["uid"], sorted(fenced))
    want = body["data"][FENCE_LIST_KEY]
    key = (namespace, name, meta["uid"])
    if STATUS_ROUND.get() and _fence_lists.get(key) == want:
        return
    live = read(ac, "ConfigMap", namespace, fence_configmap_name(name))
    # None made and none fenced: nothing to write (remembered as the empty list).
    if (live is not None or fenced) and (live or {}).get("data", {}).get(FENCE_LIST_KEY) != want:
        apply(ac, body)
    _fence_lists[key] = want


# The fence list each DurableStream's ConfigMap was last seen or written to hold: a
# status round reads the ConfigMap only when the list changed, a whole reconcile (every
# resync interval) always, so a hand edit or a deletion is put right within one, as a
# reconcile puts right a rendered object. Read every status round of every DurableStream,
# it was one request in eight of the operator's steady load (docs/kubernetes.md, API load).
_fence_lists: dict[tuple[str, str, str], str] = {}
# True while a status round (``status_round.refresh``) runs: it may trust _fence_lists.
STATUS_ROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("status_round", default=False)


def _annotated(pod: dict[str, Any], changes: dict[str, bool]) -> dict[str, Any]:
    name = pod["metadata"]["name"]
    if name not in changes:
        return pod
    annotations = dict(pod["metadata"].get("annotations") or {})
    annotations[POD_FENCED] = "true" if changes[name] else "false"
    return {**pod, "metadata": {**pod["metadata"], "annotations": annotations}}


def observed(
    ds: dict[str, Any],
    sts: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    status: dict[str, Any],
) -> dict[str, Any]:
    """The status with hibernation and fencing in it, and an Event for each change of
    hibernation's state and for a resume."""
    new = lifecycle_status(ds, sts, pods, status)
    previous = dict(ds.get("status") or {})
    if was_paused(previous):
        events.info(
            ds,
            reason="ReconcileResumed",
            message=f"{RECONCILE} removed: reconciling again",
        )
    old = _reason(previous, "Hibernated")
    now = next((c for c in new["conditions"] if c["type"] == "Hibernated"), None)
    if now is not None and now["reason"] != old and not (old is None and now["reason"] == "Awake"):
        events.info(ds, reason=now["reason"], message=now["message"])
    if _reason(previous, "Fenced") == "Fenced" and _reason(new, "Fenced") is None:
        events.info(ds, reason="Unfenced", message=f"{FENCED_INSTANCES} removed: no pod fenced")
    return new


def _reason(status: dict[str, Any], ctype: str) -> str | None:
    return next(
        (c.get("reason") for c in status.get("conditions") or [] if c.get("type") == ctype), None
    )
