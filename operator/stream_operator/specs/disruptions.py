"""How many of a DurableStream's pods a voluntary disruption (a node drain, an eviction)
may take away at once: the PodDisruptionBudget's spec, and the condition that says so.

The rule, for a replica set: one pod at a time whenever the set stays writable with one
pod away, that is ``replicas - 1 >= minInSync``, or durability ``preferred`` (the primary
then acknowledges on fewer). The pods counted are the Ready ones, and a replica set's pod
is Ready only while it is in the Lease's in-sync set (the ``streams.pyds.dev/in-sync``
readiness gate), so a drain moves on only once the pod it replaced has caught up. The
primary may be evicted like any pod: on SIGTERM it hands its Lease to an in-sync standby
before it stops (docs/replication.md).

Where one pod away would stop writes (durability ``required`` and ``minInSync`` equal to
``replicas``, which a majority of two is) the budget lets no pod go: a drain waits, and
``kubectl drain`` says the budget refuses, rather than turning a node's maintenance
into a write outage for as long as the node is away (a pod on a local volume cannot
come back elsewhere). The ``Drainable`` condition names the way out. CloudNativePG
does the same for what it cannot move: its primary's budget keeps the primary.

Unhealthy pods may always be evicted (``unhealthyPodEvictionPolicy: AlwaysAllow``): a pod
that is not Ready is not in sync, so no write waits for it, and evicting it costs the
set nothing; with the default ``IfHealthyBudget`` one crash-looping pod would block
every drain of its node.

A single server keeps ``maxUnavailable: 1``: there is no one to hand over to, and a
budget that never lets it go would block drains for good; clients wait while it restarts.
"""

from __future__ import annotations

from typing import Any

from stream_operator.api.spec import SpecInput, with_defaults

CONDITION = "Drainable"


def keeps_writable(spec: SpecInput) -> bool:
    """Whether a replica set still acknowledges writes with one of its pods away."""
    s = with_defaults(spec)
    if s.replication.durability == "preferred":
        return True
    return s.replicas - 1 >= s.min_in_sync


def budget(spec: SpecInput) -> dict[str, Any]:
    """The PodDisruptionBudget's spec without its selector."""
    s = with_defaults(spec)
    if not s.replicated:
        return {"maxUnavailable": 1}
    if keeps_writable(s):
        return {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    return {"minAvailable": s.replicas, "unhealthyPodEvictionPolicy": "AlwaysAllow"}


def drain_condition(spec: SpecInput) -> dict[str, str]:
    """``Drainable`` for a replica set: True when the budget lets a drain take one pod at a
    time; False, with the fix, when every pod is needed for writes."""
    s = with_defaults(spec)
    replicas, need = s.replicas, s.min_in_sync
    if keeps_writable(s):
        why = (
            "durability preferred"
            if s.replication.durability == "preferred"
            else f"minInSync {need} of {replicas} replicas"
        )
        return _condition(True, "OnePodAtATime", f"a drain may evict one pod at a time ({why})")
    return _condition(
        False,
        "EveryPodNeeded",
        f"minInSync {need} of {replicas} replicas with durability required: every write "
        "needs every pod, so the PodDisruptionBudget lets no pod be evicted and node drains "
        "wait; set replication.minInSync below replicas (add a replica first) or "
        "durability: preferred",
    )


def _condition(ok: bool, reason: str, message: str) -> dict[str, str]:
    return {
        "type": CONDITION,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
    }
