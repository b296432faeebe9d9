"""Scaling a DurableStream to one replica and back up without hiding a write.

A replica set scaled down to one replica runs pod 0 alone in single-node mode: it
leaves its set (docs/replication.md, "A set's identity") and acknowledges writes the
removed pods never get. Their volumes (the StatefulSet's ``whenScaled: Retain``) still
hold the old set's data at its old position, and the Lease ``<name>-leader`` still
names that set: scaled up again as they are, a removed pod, in sync by the old Lease,
could lead the old set without what pod 0 acknowledged alone. So, as CloudNativePG
deletes a removed instance's claim:

- at one replica, once the StatefulSet asks for one pod, the removed pods are gone and
  pod 0 runs the current (single-node) revision, the Lease and the claims of the
  other ordinals are deleted, whatever ``pvcRetention`` says: they are copies of a set
  that no longer exists (pod 0 holds everything it acknowledged);
- a scale-up from one waits, the StatefulSet kept at one pod, until both are gone
  (an operator restarted in between finishes them first). Then pod 0, holding the data
  and no set id, creates a new set and leads; the new pods start on new, empty volumes
  and copy from it.

A scale-down to one goes in two steps. First the StatefulSet asks for one pod while its
template and the ConfigMap stay the set's (``set_size_while_scaling_to_one``): pod 0, the
primary, keeps running as the set's primary while pods 1.. stop. Only once they are
gone is the single-node template applied and pod 0 restarted alone. In one step a
StatefulSet controller (Parallel pod management) may restart pod 0 while the others
are still stopping: pod 0 would hand its Lease over on SIGTERM to a standby that is
itself stopping, which could acknowledge writes pod 0, back alone, never has.

A scale-up from one also needs pod 0 to restart as a replica: a replica set's
StatefulSet replaces pods only when the operator deletes them (``rollout.py``), and with
no Lease there is no primary to roll around; ``rollout.plan_rollout`` replaces the
bootstrap pod first then.

Pure functions over the objects as the API returns them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_operator.decisions.rollout import REPLICA_NAME_ENV, SERVER_CONTAINER

REVISION_LABEL = "controller-revision-hash"
WAITING = "WaitingForScaleDownCleanup"  # the Progressing reason while a scale-up waits
SCALING_DOWN = "ScalingDownToOne"  # the Progressing reason of a scale-down's two steps


@dataclass(frozen=True)
class ScalePlan:
    """How many pods the StatefulSet may ask for now, what to delete first, and (when a
    scale-up waits) why."""

    replicas: int
    delete_lease: bool = False
    delete_claims: tuple[str, ...] = ()
    waiting: str | None = None
    reason: str = WAITING  # the Progressing reason while ``waiting``

    @property
    def deletes(self) -> bool:
        return self.delete_lease or bool(self.delete_claims)


def _ordinal(name: str, prefix: str) -> int | None:
    tail = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def plan_scaling(
    name: str,
    wanted: int,
    statefulset: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    lease: Mapping[str, Any] | None,
) -> ScalePlan:
    """The next step of a scale to or from one replica (see the module's docstring).

    ``wanted``: the spec's replicas; ``statefulset``: the live one (None: not made yet);
    ``pods``, ``claims``: the instance's pods and PVCs as listed; ``lease``: the
    replica set's Lease (None: there is none)."""
    live = int(((statefulset or {}).get("spec") or {}).get("replicas") or 0)
    if statefulset is None or live != 1:
        return ScalePlan(wanted)
    if _runs_a_set(statefulset):
        # A scale-down to one under way: pod 0 still runs as the set's primary, and
        # nothing is deleted. Scaled up again meanwhile, the pods simply rejoin it.
        if wanted > 1:
            return ScalePlan(wanted)
        stopping = sorted(
            _meta(p)["name"]
            for p in pods
            if (_ordinal(_meta(p).get("name", ""), f"{name}-") or 0) >= 1
        )
        why = (
            f"waiting for {', '.join(stopping)} to stop before {name}-0 restarts alone"
            if stopping
            else f"restarting {name}-0 alone (single-node mode)"
        )
        return ScalePlan(1, waiting=f"scaling down to one replica: {why}", reason=SCALING_DOWN)
    leftover = sorted(
        _meta(c)["name"]
        for c in claims
        if (_ordinal(_meta(c).get("name", ""), f"data-{name}-") or 0) >= 1
    )
    if lease is None and not leftover:
        return ScalePlan(wanted)
    status = statefulset.get("status") or {}
    revision = status.get("updateRevision")
    seen = (status.get("observedGeneration") or 0) >= (_meta(statefulset).get("generation") or 0)
    by_ordinal = {
        o: p for p in pods if (o := _ordinal(_meta(p).get("name", ""), f"{name}-")) is not None
    }
    removed = sorted(f"{name}-{o}" for o in by_ordinal if o >= 1)
    pod0 = by_ordinal.get(0)
    pod0_revision = ((_meta(pod0).get("labels") or {}) if pod0 else {}).get(REVISION_LABEL)
    what = " and ".join(
        part
        for part in (
            f"the Lease {name}-leader" if lease is not None else "",
            f"the claims {', '.join(leftover)}" if leftover else "",
        )
        if part
    )
    if removed:
        why = f"waiting for {', '.join(removed)} to be gone before deleting {what}"
        deletes: dict[str, Any] = {}
    elif not seen or (pod0_revision is not None and pod0_revision != revision):
        why = f"waiting for {name}-0 to run alone before deleting {what}"
        deletes = {}
    else:
        why = f"deleting {what}: copies of a set that no longer exists"
        claims_now = tuple(
            n
            for n in leftover
            if not next(
                (_meta(c).get("deletionTimestamp") for c in claims if _meta(c).get("name") == n),
                None,
            )
        )
        deletes = {"delete_lease": lease is not None, "delete_claims": claims_now}
    if wanted <= 1:
        return ScalePlan(1, **deletes)
    return ScalePlan(
        1,
        waiting=f"scaling 1 -> {wanted} once {name}-0 is the only copy: {why}",
        **deletes,
    )


def set_size_while_scaling_to_one(
    name: str,
    wanted: int,
    statefulset: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any] | None,
) -> int | None:
    """The set size to keep rendering while a replica set goes down to one replica (the
    first of the two steps in the module's docstring), or None: render the spec as it is.

    ``config``: the live ConfigMap, whose ``DS_REPLICATION_SET_SIZE`` is the size the
    running pods were made with; rendering that size again changes neither the template
    nor the config, so no pod restarts while pods 1.. stop."""
    if wanted != 1 or statefulset is None or not _runs_a_set(statefulset):
        return None
    size = str(((config or {}).get("data") or {}).get("DS_REPLICATION_SET_SIZE") or "")
    if not size.isdigit() or int(size) < 2:
        return None
    live = int((statefulset.get("spec") or {}).get("replicas") or 0)
    others = [p for p in pods if (_ordinal(_meta(p).get("name", ""), f"{name}-") or 0) >= 1]
    return int(size) if live > 1 or others else None


def _runs_a_set(statefulset: Mapping[str, Any]) -> bool:
    """Whether the StatefulSet's pod template is a replica set's: its server container
    has the replica identity (``render.replica_identity_env``)."""
    template = (statefulset.get("spec") or {}).get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    server = next((c for c in containers if c.get("name") == SERVER_CONTAINER), None)
    return server is not None and any(
        e.get("name") == REPLICA_NAME_ENV for e in server.get("env") or []
    )


def cleaned_message(name: str, plan: ScalePlan) -> str:
    """The Event's message for what ``plan`` deleted."""
    gone = ([f"Lease {name}-leader"] if plan.delete_lease else []) + [
        f"PVC {c}" for c in plan.delete_claims
    ]
    return (
        f"deleted {', '.join(gone)}: at one replica {name}-0 holds every acknowledged write "
        "and left the replica set; these were copies of that set (deleted whatever "
        f"pvcRetention says), and a scale-up starts a new set from {name}-0"
    )
