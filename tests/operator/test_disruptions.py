"""Issue 25: the PodDisruptionBudget lets a drain take one pod at a time whenever the set
stays writable with one pod away, and says so (the ``Drainable`` condition) when it
cannot. The budgets are also run through testkit.disruption, the emulated API server's
eviction rules (checked against Kubernetes' own behaviour in test_emulator), with every
pod Ready: that is where the old ``minAvailable: 2`` of 2 refused every eviction."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from stream_operator.decisions.status import compute_status
from stream_operator.specs.disruptions import budget, drain_condition, keeps_writable
from stream_operator.specs.render import render_pdb
from testkit.disruption import budget_status

K8S_VERSION = "1.31"  # as tests/operator/test_chart.py


def rep(replicas: int, min_in_sync: int = 0, durability: str = "required") -> dict[str, Any]:
    return {
        "replicas": replicas,
        "replication": {"minInSync": min_in_sync, "durability": durability},
    }


@pytest.mark.parametrize(
    ("spec", "writable"),
    [
        (rep(3), True),  # majority 2 of 3: one away leaves 2
        (rep(3, 2), True),
        (rep(3, 3), False),
        (rep(2), False),  # majority of 2 is 2: the old budget's case
        (rep(2, 1), True),
        (rep(2, durability="preferred"), True),  # the primary acknowledges alone meanwhile
        (rep(3, 3, "preferred"), True),
        (rep(5), True),
        (rep(5, 4), True),
        (rep(5, 5), False),
    ],
)
def test_a_replica_set_stays_writable_with_one_pod_away_or_the_budget_keeps_every_pod(
    spec: dict[str, Any], writable: bool
) -> None:
    assert keeps_writable(spec) is writable
    want = {"maxUnavailable": 1} if writable else {"minAvailable": spec["replicas"]}
    assert budget(spec) == {**want, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    cond = drain_condition(spec)
    assert cond["status"] == ("True" if writable else "False")
    if not writable:
        assert "minInSync" in cond["message"] and "durability: preferred" in cond["message"]
    pdb = render_pdb("ev", "ns", "uid-1", spec)
    kubernetes_validate.validate(pdb, K8S_VERSION, strict=True)
    # All pods Ready (in sync): one may go exactly when the set stays writable.
    replicas = spec["replicas"]
    allowed = budget_status(pdb, [ready_pod(i) for i in range(replicas)], replicas)
    assert allowed["disruptionsAllowed"] == (1 if writable else 0)


def test_one_server_keeps_max_unavailable_one_and_no_drain_condition() -> None:
    """No one to hand over to: the server goes and comes back (a drain is not blocked for
    good); a single server's status has no Drainable condition."""
    assert budget({"replicas": 1}) == {"maxUnavailable": 1}
    status = compute_status(spec={"replicas": 1}, generation=1, statefulset=None, endpoint="e")
    assert "Drainable" not in {c["type"] for c in status["conditions"]}


def test_the_status_of_a_replica_set_says_whether_drains_can_move_on() -> None:
    sts = {"metadata": {"generation": 1}, "status": {"replicas": 2, "readyReplicas": 2}}
    for spec, ok in ((rep(2), "False"), (rep(3), "True")):
        status = compute_status(spec=spec, generation=1, statefulset=sts, endpoint="e")
        drainable = [c for c in status["conditions"] if c["type"] == "Drainable"]
        assert [c["status"] for c in drainable] == [ok]


def test_a_pod_catching_up_holds_the_drain_back() -> None:
    """One replaced pod not yet in sync (not Ready): no second pod may go, but the one
    catching up may (it is not counted)."""
    pdb = render_pdb("ev", "ns", "uid-1", rep(3))
    pods = [ready_pod(0), ready_pod(1), ready_pod(2, ready=False)]
    status = budget_status(pdb, pods, 3)
    assert (status["currentHealthy"], status["desiredHealthy"]) == (2, 2)
    assert status["disruptionsAllowed"] == 0


def ready_pod(ordinal: int, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ev-{ordinal}",
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/name": "durable-streams",
                "app.kubernetes.io/instance": "ev",
            },
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
