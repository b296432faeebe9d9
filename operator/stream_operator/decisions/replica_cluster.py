"""Declarative promotion and demotion of a replica cluster: what to render for each state,
the ``ReplicaCluster`` condition, and the Event each step is told with. Pure functions;
``replica_cluster_actions`` reads what they need and carries the answer out.

``spec.replica.enabled`` is the one switch, as CloudNativePG's ``replica.enabled``:

- **promotion** (``true`` -> ``false`` on a set whose pods follow): the pods are rendered
  as writers again (no ``DS_ARCHIVE_FOLLOW``, ``spec.backup``'s own archive); each
  server, at that start, takes a term above the source's (docs/replica-clusters.md).
  ``Promoting`` until every pod runs the new template and is ready, then ``Promoted``;
- **demotion** (``false``/absent -> ``true`` with a ``source``, on a set whose pods
  wrote): first the writers stop (the StatefulSet is held at 0 pods, its writer template
  kept, so nothing restarts as a follower on the old data: ``Demoting``). Then the
  volumes: they hold this set's own history, which a follower refuses (the server
  follows only an empty directory or its own archive's frames) and which may hold writes
  the new primary never saw (divergent history, after the point it was promoted from).
  The operator cannot tell which from here, so ``replica.demotionPolicy`` decides:
  ``Refuse`` (the default) keeps the set stopped with its claims and says so
  (``DemotionRefused``, a Warning Event); ``Rebuild`` deletes the claims and, once they
  are gone, renders the followers at ``spec.replicas`` on new empty volumes: each
  restores the followed archive's newest base backup (``Rebuilding``), then follows
  (``FollowingSource``, Event ``Demoted``).

What the pods were last rendered as is recorded on the StatefulSet (``ROLE``), not in
the status: the StatefulSet is what the pods run, and a status write can be lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stream_operator import GROUP
from stream_operator.api.conditions import condition
from stream_operator.api.spec import DurableStreamSpec

CONDITION = "ReplicaCluster"
ROLE = f"{GROUP}/archive-role"  # on the StatefulSet: what its pods were rendered as
FOLLOWER, WRITER = "follower", "writer"
REFUSE, REBUILD = "Refuse", "Rebuild"
DEMOTION_POLICIES = (REFUSE, REBUILD)

FOLLOWING = "FollowingSource"
PROMOTING = "Promoting"
PROMOTED = "Promoted"
DEMOTING = "Demoting"
DEMOTION_REFUSED = "DemotionRefused"
REBUILDING = "Rebuilding"
_DEMOTION = (DEMOTING, DEMOTION_REFUSED, REBUILDING)


@dataclass(frozen=True)
class Wanted:
    """What the spec asks of the set's archive role."""

    enabled: bool  # spec.replica.enabled
    source: str | None  # the followed archive's destinationPath
    own: str | None  # spec.backup.objectStore.destinationPath
    policy: str = REFUSE  # spec.replica.demotionPolicy


@dataclass(frozen=True)
class Seen:
    """What the set is now, as read."""

    recorded: str | None  # ROLE on the StatefulSet; None: no StatefulSet yet
    pods: int  # the set's server pods that exist (in any phase)
    claims: int  # its data claims that exist (deleting ones too)
    rolled_out: bool  # every pod runs the StatefulSet's template and is ready
    previous: str | None  # the ReplicaCluster condition's reason, as last written


@dataclass(frozen=True)
class Step:
    """What to render and do now, and what the condition says (None: no condition)."""

    follow: bool  # render the pods as followers of the source
    hold_at_zero: bool  # keep the StatefulSet at 0 pods
    delete_claims: bool
    condition: dict[str, str] | None


def wanted(spec: DurableStreamSpec) -> Wanted:
    """The parts of the parsed spec the decisions read."""
    rep, backup = spec.replica, spec.backup
    return Wanted(
        enabled=rep.enabled,
        source=rep.source.destination_path if rep.source is not None else None,
        own=backup.object_store.destination_path if backup is not None else None,
        policy=rep.demotion_policy,
    )


def decide(want: Wanted, seen: Seen) -> Step:
    """The step for ``want`` given ``seen``: a pure state machine over the recorded role."""
    if want.enabled and seen.recorded in (None, FOLLOWER):
        return _following(want, seen)
    if want.enabled:
        return _demoting(want, seen)
    if seen.recorded == FOLLOWER:
        return Step(False, False, False, _cond(PROMOTING, _promoting(want)))
    if seen.previous in (FOLLOWING, PROMOTING, PROMOTED):
        # Just rendered as writers (this reconcile's own apply), or rolling out since.
        if seen.previous != PROMOTED and not seen.rolled_out:
            return Step(False, False, False, _cond(PROMOTING, _promoting(want)))
        archive = f", archiving to {want.own}" if want.own else " (no archive of its own)"
        message = f"promoted: no longer follows {want.source or 'its source'}; it writes{archive}"
        return Step(False, False, False, _cond(PROMOTED, message))
    return Step(False, False, False, None)  # a set that never followed


def _following(want: Wanted, seen: Seen) -> Step:
    """Pods rendered as followers: following once they run, still rebuilding before."""
    if seen.previous in _DEMOTION and not seen.rolled_out:
        message = f"restoring {want.source}'s newest base backup on new volumes"
        return Step(True, False, False, _cond(REBUILDING, message))
    return Step(True, False, False, {**condition(CONDITION, True, FOLLOWING, _follows(want))})


def _demoting(want: Wanted, seen: Seen) -> Step:
    """A set that wrote, now asked to follow: stop, then refuse or rebuild its volumes."""
    if seen.pods:
        message = (
            f"stopping the {seen.pods} pod(s) that write, before following {want.source} "
            "(the StatefulSet is held at 0 replicas)"
        )
        return Step(False, True, False, _cond(DEMOTING, message))
    if seen.claims and want.policy != REBUILD:
        message = (
            f"stopped, but its {seen.claims} volume(s) hold this set's own history, which a "
            f"follower of {want.source} cannot take and which may hold writes the new primary "
            "never saw: copy what you need, then set spec.replica.demotionPolicy: Rebuild to "
            "delete them and restore from that archive's newest base backup"
        )
        return Step(False, True, False, _cond(DEMOTION_REFUSED, message))
    if seen.claims:
        message = (
            f"deleting its {seen.claims} volume claim(s) (demotionPolicy Rebuild); new volumes "
            f"will restore {want.source}'s newest base backup"
        )
        return Step(False, True, True, _cond(REBUILDING, message))
    message = f"restoring {want.source}'s newest base backup on new volumes"
    return Step(True, False, False, _cond(REBUILDING, message))


def _follows(want: Wanted) -> str:
    return f"follows {want.source} read-only (writes refused)"


def _promoting(want: Wanted) -> str:
    archive = f", archiving to {want.own}" if want.own else ""
    return (
        f"restarting the pods without following {want.source or 'the source'}: each writes "
        f"under a term above the source's{archive}"
    )


def _cond(reason: str, message: str) -> dict[str, str]:
    return condition(CONDITION, False, reason, message)


EVENTS: Mapping[str, tuple[bool, str]] = {
    # reason entered -> (a Warning?, the Event's reason)
    PROMOTING: (False, "Promoting"),
    PROMOTED: (False, "Promoted"),
    DEMOTING: (False, "Demoting"),
    DEMOTION_REFUSED: (True, "DemotionRefused"),
    REBUILDING: (False, "Rebuilding"),
}


def step_events(
    previous: str | None, cond: Mapping[str, str] | None
) -> list[tuple[bool, str, str]]:
    """The Events for entering ``cond``'s reason from ``previous``: (warning, reason,
    message) each; none when nothing changed (or a set simply follows from its start).
    A demotion always says ``Demoting`` first, also when a status round saw the pods gone
    before it saw them stopping."""
    if cond is None or cond["reason"] == previous:
        return []
    reason = cond["reason"]
    if reason == FOLLOWING:
        return [(False, "Demoted", f"demoted: {cond['message']}")] if previous in _DEMOTION else []
    said = []
    if reason in _DEMOTION and reason != DEMOTING and previous not in _DEMOTION:
        said.append((False, "Demoting", "demoting: the pods that wrote were stopped"))
    warning, kind = EVENTS[reason]
    return [*said, (warning, kind, cond["message"])]


def previous_reason(status: Mapping[str, Any]) -> str | None:
    """The ReplicaCluster condition's reason in ``status`` (None: no such condition)."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == CONDITION:
            return str(cond.get("reason") or "") or None
    return None


def rolled_out(sts: Mapping[str, Any] | None) -> bool:
    """Every pod the StatefulSet asks for runs its current template and is ready, as its
    controller reports for the StatefulSet's current generation."""
    if sts is None:
        return False
    meta, spec, st = sts.get("metadata") or {}, sts.get("spec") or {}, sts.get("status") or {}
    want = int(spec.get("replicas") or 0)
    return (
        want > 0
        and (st.get("observedGeneration") or 0) >= (meta.get("generation") or 0)
        and st.get("updateRevision") == st.get("currentRevision")
        and int(st.get("updatedReplicas") or 0) == want
        and int(st.get("readyReplicas") or 0) == want
    )


def refused(want: Wanted) -> str | None:
    """Why a spec is refused whole: a promoted set archiving where its source does (the
    server refuses to start so: two primaries would write one archive), a policy the
    schema does not know."""
    if want.policy not in DEMOTION_POLICIES:
        return f"replica.demotionPolicy must be Refuse or Rebuild, not {want.policy!r}"
    if not want.enabled and want.source and want.own and _same(want.source, want.own):
        return (
            f"backup.objectStore.destinationPath is the archive this set followed ({want.own}): "
            "a promoted set must archive elsewhere, or two primaries would write one archive"
        )
    return None


def _same(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")
