"""Issue 25: a scale to one replica deletes the old set's copies, and a scale-up from one
waits until they are gone (scaling.py, pure).

At one replica pod 0 leaves the set; the Lease and the removed pods' claims still hold
that set, and a stale member of it could lead after a scale-up without what pod 0
acknowledged alone. They go once the StatefulSet asks for one pod, the removed pods are
gone and pod 0 runs alone; a scale-up from one is held at one pod until then.
"""

from __future__ import annotations

from typing import Any

from stream_operator.decisions.scaling import (
    ScalePlan,
    cleaned_message,
    plan_scaling,
    set_size_while_scaling_to_one,
)

REV = "ev-2"


def sts(replicas: int, *, generation: int = 4, observed: int = 4) -> dict[str, Any]:
    return {
        "metadata": {"name": "ev", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": observed, "updateRevision": REV},
    }


def pod(i: int, revision: str = REV) -> dict[str, Any]:
    return {"metadata": {"name": f"ev-{i}", "labels": {"controller-revision-hash": revision}}}


def claim(i: int, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"data-ev-{i}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


LEASE = {"metadata": {"name": "ev-leader"}}
CLAIMS = [claim(0), claim(1), claim(2)]


def test_nothing_to_do_unless_the_statefulset_is_at_one_pod() -> None:
    assert plan_scaling("ev", 3, None, [], [], None) == ScalePlan(3)
    assert plan_scaling("ev", 5, sts(3), [pod(0)], CLAIMS, LEASE) == ScalePlan(5)
    assert plan_scaling("ev", 1, sts(3), [pod(0)], CLAIMS, LEASE) == ScalePlan(1)
    # One server that was never a set: nothing left over, a scale-up goes ahead.
    assert plan_scaling("ev", 3, sts(1), [pod(0)], [claim(0)], None) == ScalePlan(3)


def test_scaled_down_to_one_the_lease_and_the_removed_claims_go_once_pod_0_runs_alone() -> None:
    # The removed pods are still there: wait.
    plan = plan_scaling("ev", 1, sts(1), [pod(0), pod(2)], CLAIMS, LEASE)
    assert plan == ScalePlan(1)
    # Pod 0 still runs the replica set's revision (it leaves the set when it restarts).
    assert plan_scaling("ev", 1, sts(1), [pod(0, "ev-1")], CLAIMS, LEASE) == ScalePlan(1)
    # The controller has not seen the one-pod template yet.
    assert plan_scaling("ev", 1, sts(1, observed=3), [pod(0)], CLAIMS, LEASE) == ScalePlan(1)
    plan = plan_scaling("ev", 1, sts(1), [pod(0)], CLAIMS, LEASE)
    assert plan == ScalePlan(1, delete_lease=True, delete_claims=("data-ev-1", "data-ev-2"))
    # Pod 0 being recreated counts as alone too (it comes back on the current revision).
    assert plan_scaling("ev", 1, sts(1), [], CLAIMS, LEASE).deletes
    # Claim 0 is pod 0's: never deleted. A claim being deleted is not deleted again.
    plan = plan_scaling("ev", 1, sts(1), [pod(0)], [claim(0), claim(1, deleting=True)], None)
    assert plan == ScalePlan(1)
    # All gone: nothing more.
    assert plan_scaling("ev", 1, sts(1), [pod(0)], [claim(0)], None) == ScalePlan(1)


def test_a_scale_up_from_one_waits_until_the_old_copies_are_gone() -> None:
    plan = plan_scaling("ev", 3, sts(1), [pod(0), pod(1)], CLAIMS, LEASE)
    assert plan.replicas == 1 and not plan.deletes
    assert plan.waiting is not None and "ev-1 to be gone" in plan.waiting
    plan = plan_scaling("ev", 3, sts(1), [pod(0)], CLAIMS, LEASE)
    assert plan.replicas == 1 and plan.delete_lease
    assert plan.delete_claims == ("data-ev-1", "data-ev-2")
    assert plan.waiting is not None and plan.waiting.startswith("scaling 1 -> 3")
    # Deleted, but a claim is still terminating: still one pod.
    plan = plan_scaling("ev", 3, sts(1), [pod(0)], [claim(0), claim(2, deleting=True)], None)
    assert (plan.replicas, plan.deletes) == (1, False) and plan.waiting
    assert plan_scaling("ev", 3, sts(1), [pod(0)], [claim(0)], None) == ScalePlan(3)


def test_the_event_says_what_went_and_why() -> None:
    plan = ScalePlan(1, delete_lease=True, delete_claims=("data-ev-1",))
    message = cleaned_message("ev", plan)
    assert message.startswith("deleted Lease ev-leader, PVC data-ev-1: ")
    assert "pvcRetention" in message and "ev-0" in message


def set_sts(replicas: int) -> dict[str, Any]:
    """A StatefulSet whose template is still the replica set's (the replica identity)."""
    out = sts(replicas)
    env = [{"name": "DS_REPLICA_NAME", "value": "$(POD_NAME)"}]
    out["spec"]["template"] = {"spec": {"containers": [{"name": "server", "env": env}]}}
    return out


CONFIG = {"data": {"DS_REPLICATION_SET_SIZE": "3"}}


def test_a_scale_down_to_one_keeps_the_sets_template_until_pods_1_on_are_gone() -> None:
    """Step one of two: the StatefulSet asks for one pod, the template and config stay the
    set's, so pod 0 keeps running as the primary while the others stop; only then is the
    single-node template applied (a controller restarting pod 0 at once could let it hand
    its Lease to a standby that is itself stopping)."""
    keep = set_size_while_scaling_to_one
    assert keep("ev", 1, set_sts(3), [pod(0), pod(1), pod(2)], CONFIG) == 3
    assert keep("ev", 1, set_sts(1), [pod(0), pod(2)], CONFIG) == 3  # pod 2 still stopping
    assert keep("ev", 1, set_sts(1), [pod(0)], CONFIG) is None  # alone: step two
    assert keep("ev", 3, set_sts(3), [pod(0)], CONFIG) is None  # no scale to one
    assert keep("ev", 1, sts(1), [pod(0), pod(1)], CONFIG) is None  # single-node template
    assert keep("ev", 1, set_sts(3), [pod(0)], {"data": {}}) is None  # no set size known
    # Nothing is deleted while pod 0 still runs as the set's primary, and a scale back up
    # meanwhile simply brings the members back.
    plan = plan_scaling("ev", 1, set_sts(1), [pod(0), pod(2)], CLAIMS, LEASE)
    assert (plan.replicas, plan.deletes, plan.reason) == (1, False, "ScalingDownToOne")
    assert plan.waiting is not None and "ev-2 to stop before ev-0 restarts alone" in plan.waiting
    plan = plan_scaling("ev", 1, set_sts(1), [pod(0)], CLAIMS, LEASE)
    assert (plan.deletes, plan.reason) == (False, "ScalingDownToOne")
    assert plan_scaling("ev", 3, set_sts(1), [pod(0)], CLAIMS, LEASE) == ScalePlan(3)
