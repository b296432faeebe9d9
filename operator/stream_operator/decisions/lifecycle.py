"""The lifecycle annotations on a DurableStream, as CloudNativePG has them on a Cluster:
what each asks for and what the status then says. Pure functions; ``lifecycle_actions``
carries them out.

- ``streams.pyds.dev/reconcile: paused`` (``cnpg.io/reconciliationLoop: disabled``): the
  operator applies, prunes, rolls, labels and switches over nothing for the object; it
  only writes the ``ReconcilePaused`` condition (the rest of the status stays as it was).
  Removing it (or any other value) resumes, and the next round converges.
- ``streams.pyds.dev/hibernation: "on"`` (``cnpg.io/hibernation``): the StatefulSet goes to
  0 replicas; the claims (``whenScaled: Retain``), the Lease, the peer token and every
  other object stay. ``"off"`` or no annotation: back to ``spec.replicas``. The servers
  wake on the most advanced copy by their own election rule, since the Lease they kept
  still names the last holder, its in-sync set and the eligible standbys
  (docs/kubernetes.md, Hibernation).
- ``streams.pyds.dev/fenced-instances: '["events-1"]'`` (``cnpg.io/fencedInstances``; ``["*"]``
  for every pod): each named pod gets the annotation ``streams.pyds.dev/fenced: "true"``
  (``"false"`` once lifted), which its server reads through the downward API
  (stream_server/fencing.py); the list itself goes into the ConfigMap ``<name>-fence`` the
  pods mount too, which fences a pod made later from its start.

The annotations are read in the status round, every few seconds: kopf hides the
``streams.pyds.dev/`` annotations from its own change detection (its progress storage uses
that prefix), so an update handler would never see them change.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from stream_operator import GROUP
from stream_operator.api.conditions import condition
from stream_operator.api.spec import spec_of

RECONCILE = f"{GROUP}/reconcile"
HIBERNATION = f"{GROUP}/hibernation"
FENCED_INSTANCES = f"{GROUP}/fenced-instances"
POD_FENCED = f"{GROUP}/fenced"  # on a pod: what its server's fence file holds
# ``kubectl rollout restart``'s pod template annotation, set on the DurableStream (``kubectl
# dstream restart``, as ``kubectl cnpg restart`` sets it on a Cluster) and copied into the
# StatefulSet's template: a new revision, which the operator rolls as any other.
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"

PAUSED_MESSAGE = (
    f"{RECONCILE}=paused: the operator applies, prunes, rolls, labels and switches over "
    "nothing for this object until the annotation is removed"
)


def _annotations(ds: Mapping[str, Any]) -> Mapping[str, str]:
    return (ds.get("metadata") or {}).get("annotations") or {}


def paused(ds: Mapping[str, Any]) -> bool:
    return _annotations(ds).get(RECONCILE, "").strip().lower() == "paused"


def hibernating(ds: Mapping[str, Any]) -> bool:
    return _annotations(ds).get(HIBERNATION, "").strip().lower() == "on"


def fenced_instances(ds: Mapping[str, Any]) -> tuple[frozenset[str], str | None]:
    """The pod names the fence annotation lists (``"*"`` stands for all), and why it
    cannot be read (then nothing is fenced by it: the pods keep the fence they have)."""
    raw = _annotations(ds).get(FENCED_INSTANCES)
    if raw is None or not raw.strip():
        return frozenset(), None
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return frozenset(), f'{FENCED_INSTANCES} must be a JSON list of pod names or ["*"]: {raw!r}'
    return frozenset(names), None


def fence_wanted(fenced: frozenset[str], pod: str) -> bool:
    return "*" in fenced or pod in fenced


def pod_fenced(pod: Mapping[str, Any]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(POD_FENCED, "")).lower() == "true"


def fence_changes(
    fenced: frozenset[str], pods: Sequence[Mapping[str, Any]]
) -> list[tuple[str, bool]]:
    """(pod, fence it?) for each pod whose annotation is not what the fence asks for."""
    out = []
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod_fenced(pod) != fence_wanted(fenced, name):
            out.append((name, fence_wanted(fenced, name)))
    return sorted(out)


def holds_rollout(ds: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a replica set's rolling update (and a requested switchover) waits: while it
    hibernates, and while a pod is fenced, which the rollout would otherwise replace as
    a not-ready stale standby (its replacement would open the storage until fenced again)."""
    return hibernating(ds) or any(pod_fenced(p) for p in pods)


def hibernated(ds: Mapping[str, Any], statefulset: dict[str, Any]) -> dict[str, Any]:
    """The rendered StatefulSet as hibernation wants it: no replicas while it is on."""
    if hibernating(ds):
        statefulset["spec"]["replicas"] = 0
    return statefulset


def restarted(ds: Mapping[str, Any], statefulset: dict[str, Any]) -> dict[str, Any]:
    """The rendered StatefulSet with the DurableStream's ``RESTARTED_AT`` in its pod
    template. Rendered, not patched on the live StatefulSet: an apply would take a hand
    edit out again, and a replica set's pods are replaced by the operator's own rolling
    update (standbys first, the primary last after a switchover: ``rollout``), which a
    ``kubectl rollout restart`` of its OnDelete StatefulSet would not start at all."""
    when = _annotations(ds).get(RESTARTED_AT)
    if when:
        template = statefulset["spec"]["template"].setdefault("metadata", {})
        template.setdefault("annotations", {})[RESTARTED_AT] = when
    return statefulset


def restart_pending(ds: Mapping[str, Any], sts: Mapping[str, Any] | None) -> bool:
    """Whether the DurableStream asks for a restart its StatefulSet's template lacks."""
    when = _annotations(ds).get(RESTARTED_AT)
    if not when or sts is None:
        return False
    template = ((sts.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return (template.get("annotations") or {}).get(RESTARTED_AT) != when


def replicas_anyway(ds: Mapping[str, Any], sts: Mapping[str, Any] | None) -> int | None:
    """The replicas a StatefulSet must have although the spec was refused (and so nothing
    applied): 0 to hibernate, ``spec.replicas`` to wake; None when it has them already."""
    if sts is None:
        return None
    live = int((sts.get("spec") or {}).get("replicas") or 0)
    if hibernating(ds):
        return 0 if live != 0 else None
    wanted = spec_of(ds).replicas
    return wanted if live == 0 and wanted > 0 else None


def wants_converge(ds: Mapping[str, Any], sts: Mapping[str, Any] | None) -> bool:
    """Whether a status round must converge instead (the annotations asked for what only
    an apply does): a resume, a StatefulSet not yet at hibernation's replicas, or a
    restart asked for (``RESTARTED_AT``) that its template does not carry yet."""
    if paused(ds):
        return False
    if _condition(ds.get("status") or {}, "ReconcilePaused").get("status") == "True":
        return True
    if sts is None:
        return False
    if restart_pending(ds, sts):
        return True
    replicas = int((sts.get("spec") or {}).get("replicas") or 0)
    if hibernating(ds):
        return replicas != 0
    return replicas == 0 and spec_of(ds).replicas > 0


def _condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})


def paused_status(previous: Mapping[str, Any]) -> dict[str, Any]:
    """The status of a paused object: as it was, with ``ReconcilePaused``."""
    kept = [c for c in previous.get("conditions") or [] if c.get("type") != "ReconcilePaused"]
    old = _condition(previous, "ReconcilePaused")
    paused_now = _stamped(condition("ReconcilePaused", True, "Paused", PAUSED_MESSAGE), old)
    return {**previous, "conditions": [*kept, paused_now]}


def was_paused(status: Mapping[str, Any]) -> bool:
    return _condition(status, "ReconcilePaused").get("status") == "True"


def lifecycle_status(
    ds: Mapping[str, Any],
    sts: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    status: dict[str, Any],
) -> dict[str, Any]:
    """``status`` (compute_status's) with what hibernation and fencing make of it."""
    previous = ds.get("status") or {}
    conditions = list(status.get("conditions") or [])
    replicas = spec_of(ds).replicas
    before = _condition(previous, "Hibernated")
    hib = None
    if hibernating(ds) and sts is not None:
        running = max(int((sts.get("status") or {}).get("replicas") or 0), len(pods))
        done = int((sts.get("spec") or {}).get("replicas") or 0) == 0 and running == 0
        if done:
            message = (
                f"all {replicas} server(s) stopped; their claims and the Lease are kept "
                f'(wake: {HIBERNATION}="off")'
            )
            hib = condition("Hibernated", True, "Hibernated", message)
        else:
            hib = condition(
                "Hibernated", False, "Hibernating", f"stopping the servers: {running} still running"
            )
        reason, message = hib["reason"], hib["message"]
        replaced = {
            "Ready": condition("Ready", False, reason, message),
            "Degraded": condition("Degraded", False, reason, "stopped on purpose"),
            "Progressing": condition("Progressing", not done, reason, message),
            "FailingOver": condition("FailingOver", False, reason, "no server runs"),
        }
        conditions = [replaced.get(c["type"], c) for c in conditions]
        status = {**status, "phase": "Hibernated" if done else "Hibernating"}
    elif before:
        if status.get("phase") == "Ready":
            hib = condition("Hibernated", False, "Awake", "woken up: every server is ready")
        elif before.get("reason") == "Awake":
            hib = condition("Hibernated", False, "Awake", str(before.get("message", "")))
        else:
            hib = condition("Hibernated", False, "Waking", f"waking: starting {replicas} server(s)")
    if hib is not None:
        conditions.append(hib)
    fenced, error = fenced_instances(ds)
    if error is not None:
        conditions.append(condition("Fenced", False, "InvalidFencedInstances", error))
    elif fenced:
        names = sorted(p["metadata"]["name"] for p in pods if pod_fenced(p))
        which = "every pod" if "*" in fenced else ", ".join(sorted(fenced))
        message = (
            f"{which} fenced ({', '.join(names) or 'none running'} now): process up, storage "
            "untouched, not ready"
        )
        conditions.append(condition("Fenced", True, "Fenced", message))
    stamped = [
        c if "lastTransitionTime" in c else _stamped(c, _condition(previous, c["type"]))
        for c in conditions
    ]
    return {**status, "conditions": stamped}


def _stamped(new: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """A condition made after ``compute_status`` stamped its own, by the same rule: the
    time it last changed status."""
    if old.get("status") == new["status"] and old.get("lastTransitionTime"):
        return {**new, "lastTransitionTime": old["lastTransitionTime"]}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**new, "lastTransitionTime": now}
