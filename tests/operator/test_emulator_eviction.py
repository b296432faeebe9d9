"""The emulated API server's Eviction API behaves as kube-apiserver's (testkit.disruption).

Each case is a documented behaviour of Kubernetes ("API-initiated Eviction",
"Specifying a Disruption Budget for your Application", and
pkg/registry/core/pod/storage/eviction.go, pkg/controller/disruption): if one of these
fails, the drain tests built on the emulator prove less than they claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest

from testkit.cluster import Cluster, cluster
from testkit.disruption import REFUSED

NS = "default"
K8S_VERSION = "1.31"  # as tests/operator/test_chart.py


@pytest.fixture(scope="module")
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def statefulset(app: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": app, "namespace": NS},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}}},
    }


def budget(app: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": NS},
        "spec": {**spec, "selector": {"matchLabels": {"app": app}}},
    }


def pods(kube: Cluster, app: str, ready: list[bool], phase: str = "Running") -> None:
    """Pods ``<app>-<i>`` of the StatefulSet ``app`` (when there is one), Ready or not."""
    sts = kube.get("StatefulSet", NS, app)
    for i, is_ready in enumerate(ready):
        meta: dict[str, Any] = {"name": f"{app}-{i}", "namespace": NS, "labels": {"app": app}}
        if sts is not None:
            uid = sts["metadata"]["uid"]
            ref = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": app, "uid": uid}
            meta["ownerReferences"] = [{**ref, "controller": True}]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}}
        kube.create(pod).raise_for_status()
        status = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if is_ready else "False"}],
        }
        kube.patch("Pod", NS, f"{app}-{i}", {"status": status}, status=True).raise_for_status()


def names(kube: Cluster, app: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in kube.list("Pod", NS, f"app={app}"))


def refused(r: Any, needs: int, has: int, app: str) -> bool:
    """The 429 kube-apiserver answers when the budget allows no disruption, word for word."""
    body = r.json()
    return (
        r.status_code == 429
        and body["reason"] == "TooManyRequests"
        and body["message"] == REFUSED
        and body["details"]["causes"]
        == [
            {
                "reason": "DisruptionBudget",
                "message": f"The disruption budget {app} needs {needs} healthy pods "
                f"and has {has} currently",
            }
        ]
    )


def test_a_pod_without_a_budget_is_evicted_and_the_call_is_rbacs_create_on_pods_eviction(
    kube: Cluster,
):
    pods(kube, "free", [True])
    before = len(kube.api.requests)
    r = kube.evict(NS, "free-0")
    assert r.status_code == 201 and r.json()["status"] == "Success"
    assert [c[:3] for c in kube.api.requests[before:]] == [("create", "", "pods/eviction")]
    assert names(kube, "free") == []
    assert kube.evict(NS, "free-0").status_code == 404


def test_min_available_two_of_two_refuses_every_eviction(kube: Cluster):
    """The old replica-set budget: 2 of 2 healthy, none may go."""
    kube.create(statefulset("pair", 2)).raise_for_status()
    kube.create(budget("pair", minAvailable=2)).raise_for_status()
    pods(kube, "pair", [True, True])
    for name in ("pair-0", "pair-1"):
        assert refused(kube.evict(NS, name), 2, 2, "pair")
    assert names(kube, "pair") == ["pair-0", "pair-1"]
    status = kube.get("PodDisruptionBudget", NS, "pair")["status"]
    assert (status["disruptionsAllowed"], status["expectedPods"]) == (0, 2)


def test_max_unavailable_one_lets_one_go_until_its_replacement_is_ready(kube: Cluster):
    """maxUnavailable counts against the controller's scale: a pod gone (not yet made
    again) is unavailable, so the second eviction waits for the first's replacement."""
    kube.create(statefulset("trio", 3)).raise_for_status()
    kube.create(budget("trio", maxUnavailable=1)).raise_for_status()
    pods(kube, "trio", [True, True, True])
    assert kube.evict(NS, "trio-0").status_code == 201
    pdb = kube.get("PodDisruptionBudget", NS, "trio")
    kubernetes_validate.validate(pdb, K8S_VERSION, strict=True)  # as clients parse it
    status = pdb["status"]
    assert (status["currentHealthy"], status["desiredHealthy"]) == (3, 2)
    assert status["disruptionsAllowed"] == 0  # spent by the eviction
    assert refused(kube.evict(NS, "trio-1"), 2, 2, "trio")
    pods(kube, "trio", [True])  # trio-0 again, Ready
    assert kube.evict(NS, "trio-1").status_code == 201
    assert names(kube, "trio") == ["trio-0", "trio-2"]


def test_percentages_round_up(kube: Cluster):
    """maxUnavailable "50%" of 3 is 2 (desired 1); minAvailable "50%" of 3 is 2."""
    kube.create(statefulset("half", 3)).raise_for_status()
    kube.create(budget("half", maxUnavailable="50%")).raise_for_status()
    pods(kube, "half", [True, True, True])
    assert kube.evict(NS, "half-0", dry_run=True).status_code == 201
    assert names(kube, "half") == ["half-0", "half-1", "half-2"]  # a dry run deletes nothing
    assert kube.evict(NS, "half-0").status_code == 201
    assert kube.evict(NS, "half-1").status_code == 201
    assert refused(kube.evict(NS, "half-2"), 1, 1, "half")
    kube.create(statefulset("most", 3)).raise_for_status()
    kube.create(budget("most", minAvailable="50%")).raise_for_status()
    pods(kube, "most", [True, True, True])
    assert kube.evict(NS, "most-0").status_code == 201
    assert refused(kube.evict(NS, "most-1"), 2, 2, "most")


def test_an_unready_pod_goes_when_the_budget_is_met_or_the_policy_always_allows(kube: Cluster):
    """IfHealthyBudget (the default): a pod that is not Ready may go while the budget is
    met, without spending it; not while the others are short. AlwaysAllow: always."""
    kube.create(statefulset("met", 3)).raise_for_status()
    kube.create(budget("met", minAvailable=2)).raise_for_status()
    pods(kube, "met", [True, True, False])
    assert kube.evict(NS, "met-2").status_code == 201
    assert kube.get("PodDisruptionBudget", NS, "met")["status"]["disruptionsAllowed"] == 0

    kube.create(statefulset("short", 3)).raise_for_status()
    kube.create(budget("short", maxUnavailable=1)).raise_for_status()
    pods(kube, "short", [True, False, False])
    assert refused(kube.evict(NS, "short-2"), 2, 1, "short")

    kube.create(statefulset("loose", 3)).raise_for_status()
    policy = {"unhealthyPodEvictionPolicy": "AlwaysAllow"}
    kube.create(budget("loose", maxUnavailable=1, **policy)).raise_for_status()
    pods(kube, "loose", [True, False, False])
    assert kube.evict(NS, "loose-2").status_code == 201
    assert refused(kube.evict(NS, "loose-0"), 2, 1, "loose")  # a Ready one still counts


def test_pending_pods_go_without_a_check_and_two_budgets_are_an_error(kube: Cluster):
    kube.create(budget("waiting", minAvailable=5)).raise_for_status()
    pods(kube, "waiting", [False], phase="Pending")
    assert kube.evict(NS, "waiting-0").status_code == 201

    kube.create(budget("twice", minAvailable=0)).raise_for_status()
    other = budget("twice", minAvailable=0)
    other["metadata"]["name"] = "twice-again"
    kube.create(other).raise_for_status()
    pods(kube, "twice", [True])
    r = kube.evict(NS, "twice-0")
    assert r.status_code == 500 and "more than one PodDisruptionBudget" in r.json()["message"]


def test_unmanaged_pods_give_max_unavailable_nothing_to_count_from(kube: Cluster):
    """With no controller the expected count is 0: no disruption is allowed."""
    kube.create(budget("bare", maxUnavailable=1)).raise_for_status()
    pods(kube, "bare", [True, True])
    assert refused(kube.evict(NS, "bare-0"), 0, 2, "bare")


def test_the_name_in_the_body_must_be_the_pods(kube: Cluster):
    pods(kube, "named", [True])
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}}
    r = kube.http.post(kube.path("Pod", NS, "named-0") + "/eviction", json=body)
    assert r.status_code == 400
    assert names(kube, "named") == ["named-0"]
