"""Rolling a replica set onto a new pod template without losing a write, as CloudNativePG does.

A StatefulSet's own RollingUpdate replaces pods from the highest ordinal down,
whichever of them is the primary: the primary would go down with writes in
flight and the set would fail over as after a crash (a pause of a Lease
duration, and the writes that were waiting answered 503). A ``partition``
cannot avoid that either: it only holds back the ordinals below it, and the
primary may be any ordinal (say ``events-1`` of three, after a failover).

So a replica set's StatefulSet uses ``updateStrategy: OnDelete`` and the
operator replaces the pods itself, one step per round, each step decided here
from what was observed (the StatefulSet's update revision, the pods with their
``controller-revision-hash`` labels and readiness, the Lease):

1. ``UpdatingStandbys``: delete the stale standbys one at a time (not-ready
   ones first, then the highest ordinal first); the next goes only once every
   updated standby is ready and back in the Lease's in-sync set, and every
   other pod is ready.
2. ``SwitchingOver``: every standby is updated and the primary is not: ask the
   primary to hand the Lease to an updated, in-sync standby
   (``POST /replication/switchover``), and wait until the Lease names it. A
   refused or failed switchover (409, 503, no answer) changes nothing and is
   tried again the next round (``SwitchoverFailed``). The primary's pod is
   never deleted while it holds the Lease.
3. ``UpdatingFormerPrimary``: the former primary is now a standby; delete it.

``spec.primaryUpdateStrategy`` (CloudNativePG's name and values) decides step 2:
``unsupervised`` (the default) switches over by itself; ``supervised`` stops at
``WaitingForSwitchover`` once every standby is updated and in sync, and says how
to go on (``kubectl annotate dstream NAME streams.pyds.dev/switchover-to=POD``):
the user picks the moment, the operator then updates the former primary.

``StartingSet``: a pod still runs single-node (its container has no replica identity,
``DS_REPLICA_NAME``): a single server scaled up to a set (or a set scaled down to one
and back up: ``scaling.py``). It is no replica, so no Lease names it and no set can
begin without it when it is the bootstrap pod ``<name>-0``, which holds the data: it is
replaced first, whatever the other pods do (the new, empty ones wait for its Lease).

A pod without the revision label (not made by a StatefulSet controller, or an
API that does not report revisions) is taken as up to date: the operator does
not delete what it cannot judge. Pure functions: every decision is unit-tested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_operator import GROUP
from stream_operator.decisions.replica_roles import LeaseView, pod_name, pod_ready

REVISION_LABEL = "controller-revision-hash"  # set by the StatefulSet controller on its pods
# A switchover asked for by hand (CloudNativePG's ``kubectl cnpg promote``): the pod to
# make primary, as an annotation on the DurableStream.
SWITCHOVER_TO = f"{GROUP}/switchover-to"
SERVER_CONTAINER = "server"
REPLICA_NAME_ENV = "DS_REPLICA_NAME"  # only a replica set's pods have it (render.py)

STABLE = "Stable"
UPDATING_STANDBYS = "UpdatingStandbys"
SWITCHING_OVER = "SwitchingOver"
SWITCHOVER_FAILED = "SwitchoverFailed"
UPDATING_FORMER_PRIMARY = "UpdatingFormerPrimary"
WAITING_FOR_SWITCHOVER = "WaitingForSwitchover"
STARTING_SET = "StartingSet"
# Reasons after which a stale standby is the primary just switched away from.
_AFTER_SWITCHOVER = frozenset(
    {SWITCHING_OVER, SWITCHOVER_FAILED, UPDATING_FORMER_PRIMARY, WAITING_FOR_SWITCHOVER}
)
# spec.primaryUpdateStrategy (CloudNativePG's primaryUpdateStrategy).
UNSUPERVISED = "unsupervised"
SUPERVISED = "supervised"


@dataclass(frozen=True)
class Step:
    """What the rolling update does this round: its reason (the ``Progressing``
    condition's), why, and at most one action: a pod to delete or a switchover."""

    reason: str = STABLE
    message: str = "every pod runs the current revision"
    delete: str | None = None
    switchover: tuple[str, str] | None = None  # (current primary, target)

    @property
    def rolling(self) -> bool:
        return self.reason != STABLE


@dataclass(frozen=True)
class _Pod:
    name: str
    ordinal: int
    revision: str | None
    ready: bool
    deleting: bool
    single_node: bool  # no replica identity in its container: not a member of any set


def _single_node(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's server runs in single-node mode: its server container was made
    from a template without the replica identity (``render.replica_identity_env``). A
    pod without that container is not judged (False)."""
    containers = ((pod.get("spec") or {}).get("containers")) or []
    server = next((c for c in containers if c.get("name") == SERVER_CONTAINER), None)
    if server is None:
        return False
    return not any(e.get("name") == REPLICA_NAME_ENV for e in server.get("env") or [])


def _pods(pods: Sequence[Mapping[str, Any]]) -> dict[str, _Pod]:
    out = {}
    for pod in pods:
        name = pod_name(pod)
        tail = name.rsplit("-", 1)[-1]
        if not tail.isdigit():
            continue
        meta = pod.get("metadata") or {}
        out[name] = _Pod(
            name=name,
            ordinal=int(tail),
            revision=(meta.get("labels") or {}).get(REVISION_LABEL),
            ready=pod_ready(pod),
            deleting=bool(meta.get("deletionTimestamp")),
            single_node=_single_node(pod),
        )
    return out


def plan_rollout(
    name: str,
    replicas: int,
    update_revision: str | None,
    pods: Sequence[Mapping[str, Any]],
    view: LeaseView,
    previous_reason: str | None = None,
    strategy: str = UNSUPERVISED,
) -> Step:
    """The next step of a replica set's rolling update (see the module's docstring).

    ``update_revision``: the StatefulSet's ``status.updateRevision``; ``previous_reason``:
    the ``Progressing`` reason the status had, which tells the primary just switched away
    from (``UpdatingFormerPrimary``) from any other stale standby; ``strategy``: the
    spec's ``primaryUpdateStrategy`` (``supervised``: no switchover of our own).
    """
    if not update_revision:
        return Step()
    by_name = _pods(pods)
    stale = [p for p in by_name.values() if p.revision not in (None, update_revision)]
    if not stale:
        return Step()
    started = _starting_set(by_name.get(f"{name}-0"), stale)
    if started is not None:
        return started
    holder = by_name.get(view.holder)
    reason = UPDATING_STANDBYS
    if holder is not None and holder.revision in (None, update_revision):
        reason = UPDATING_FORMER_PRIMARY if previous_reason in _AFTER_SWITCHOVER else reason
    gone = [
        f"{name}-{i}"
        for i in range(replicas)
        if f"{name}-{i}" not in by_name or by_name[f"{name}-{i}"].deleting
    ]
    if gone:
        return Step(reason, f"waiting for pod {gone[0]} to be recreated")
    if holder is None or not holder.ready:
        who = view.holder or "no replica"
        return Step(reason, f"waiting for a ready primary ({who} holds the Lease)")
    standbys = [p for p in by_name.values() if p.name != holder.name]
    lagging = [
        p
        for p in sorted(standbys, key=lambda p: p.ordinal)
        if p.revision in (None, update_revision) and not (p.ready and p.name in view.synced)
    ]
    if lagging:
        return Step(reason, f"waiting for {lagging[0].name} to be ready and in sync")
    replaced = _next_standby(list(by_name.values()), standbys, stale, reason)
    if replaced is not None:
        return replaced
    return _primary_last(name, holder, standbys, view, strategy)  # only the primary is stale


def _starting_set(bootstrap: _Pod | None, stale: list[_Pod]) -> Step | None:
    """Pod 0 still in single-node mode (a single server scaled up) is updated first: it
    holds the data and starts the set."""
    if bootstrap is None or not bootstrap.single_node or bootstrap not in stale:
        return None
    if bootstrap.deleting:
        return Step(STARTING_SET, f"waiting for pod {bootstrap.name} to be recreated")
    return Step(
        STARTING_SET,
        f"updating {bootstrap.name}, which holds the data, so that it starts the set "
        "(it runs single-node: no replica leads yet)",
        delete=bootstrap.name,
    )


def _next_standby(
    everyone: list[_Pod], standbys: list[_Pod], stale: list[_Pod], reason: str
) -> Step | None:
    """The stale standby to replace next: not-ready ones first (replacing them costs
    nothing), then from the top; None when every standby is updated."""
    order = sorted((p for p in standbys if p in stale), key=lambda p: (p.ready, -p.ordinal))
    if not order:
        return None
    victim = order[0]
    unready = [p.name for p in everyone if p is not victim and not p.ready]
    if unready:
        return Step(reason, f"waiting for {unready[0]} to be ready")
    what = "the former primary" if reason == UPDATING_FORMER_PRIMARY else "a standby"
    return Step(reason, f"updating {victim.name} ({what})", delete=victim.name)


def _primary_last(
    name: str, holder: _Pod, standbys: list[_Pod], view: LeaseView, strategy: str
) -> Step:
    """Only the primary is stale: a switchover to the most advanced standby in sync first
    (the user's to start, under ``supervised``)."""
    candidates = [p for p in standbys if p.ready and p.name in view.synced]
    if not candidates:
        return Step(
            SWITCHING_OVER,
            f"waiting for an updated standby in sync to take over from {holder.name}",
        )
    target = max(candidates, key=lambda p: (view.positions.get(p.name, (0, 0)), -p.ordinal))
    if strategy == SUPERVISED:
        return Step(
            WAITING_FOR_SWITCHOVER,
            f"every standby is updated; {holder.name} (the primary) is updated after a "
            f"switchover you start (primaryUpdateStrategy: supervised): kubectl annotate "
            f"dstream {name} {SWITCHOVER_TO}={target.name}",
        )
    return Step(
        SWITCHING_OVER,
        f"switching over from {holder.name} to {target.name} before updating {holder.name}",
        switchover=(holder.name, target.name),
    )


def requested_switchover(name: str, replicas: int, target: str, view: LeaseView) -> Step | str:
    """The switchover the ``SWITCHOVER_TO`` annotation asks for, or why none is made.

    Only while no rolling update is under way (the caller's part). The target must be a
    replica of this set and in the Lease's in-sync set (the primary checks it again, and
    holds writes only once it agrees); a request for the primary itself is done already.
    """
    members = [f"{name}-{i}" for i in range(replicas)]
    if target not in members:
        return f"{target!r} is not a replica of {name} ({', '.join(members)})"
    if not view.holder:
        return "no replica holds the Lease yet"
    if target == view.holder:
        return f"{target} is the primary already"
    if target not in view.synced:
        return f"{target} is not in sync (in sync: {', '.join(sorted(view.synced))})"
    return Step(
        SWITCHING_OVER,
        f"switching over from {view.holder} to {target}, asked for with {SWITCHOVER_TO}",
        switchover=(view.holder, target),
    )


def failed_switchover(step: Step, why: str, then: str = "trying again in the next round") -> Step:
    """The step after a switchover the primary refused or did not answer: nothing changed;
    ``then`` says what happens next (a rolling update tries again the next round)."""
    assert step.switchover is not None
    source, target = step.switchover
    return Step(SWITCHOVER_FAILED, f"switchover {source} -> {target} failed ({why}); {then}")
