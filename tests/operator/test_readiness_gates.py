"""The emulated API server and the kubelet stand-in honour pod readiness gates as
Kubernetes does (issue 25: the in-sync gate a replica set's pods carry).

kube-apiserver merges a strategic merge patch of ``pods/status`` into the pod's
conditions by their type, so a controller's condition and the kubelet's live side by
side; the kubelet marks a pod Ready only when its containers are ready and every
gate's condition is True, and writes its own conditions without touching the others'.
The endpoints controller then routes by that Ready condition alone. Without these the
replica-set tests would prove nothing about the gate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stream_operator.specs.render import render_configmap, render_statefulset
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.services import ServiceEndpoints

pytestmark = pytest.mark.processes

NS = "default"
GATE = "streams.pyds.dev/in-sync"


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def conditions(kube: Cluster, pod: str) -> dict[str, dict[str, Any]]:
    status = (kube.get("Pod", NS, pod) or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def ready_replicas(kube: Cluster) -> int:
    return int(((kube.get("StatefulSet", NS, "gated") or {}).get("status") or {})["readyReplicas"])


def set_gate(kube: Cluster, pod: str, value: bool) -> None:
    cond = {"type": GATE, "status": str(value), "reason": "Test"}
    body = {"status": {"conditions": [cond]}}
    kube.patch("Pod", NS, pod, body, status=True, strategic=True).raise_for_status()


def a_pod(kube: Cluster, name: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    kube.create(pod).raise_for_status()
    ready = {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}
    kube.patch("Pod", NS, name, {"status": ready}, status=True).raise_for_status()


def test_a_strategic_merge_patch_merges_pod_conditions_by_type(kube: Cluster) -> None:
    a_pod(kube, "smp")
    set_gate(kube, "smp", True)
    assert {t: c["status"] for t, c in conditions(kube, "smp").items()} == {
        "Ready": "True",
        GATE: "True",
    }
    # The same type again is merged into its element, not appended; fields it does not
    # name stay.
    body = {"status": {"conditions": [{"type": GATE, "status": "False"}]}}
    kube.patch("Pod", NS, "smp", body, status=True, strategic=True).raise_for_status()
    cond = conditions(kube, "smp")
    assert cond[GATE]["status"] == "False" and cond[GATE]["reason"] == "Test"
    assert cond["Ready"]["status"] == "True" and len(cond) == 2
    # A merge patch replaces the list whole, as kube-apiserver's does.
    body = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    kube.patch("Pod", NS, "smp", body, status=True).raise_for_status()
    assert list(conditions(kube, "smp")) == ["Ready"]


def test_custom_resources_refuse_a_strategic_merge_patch(kube: Cluster) -> None:
    kube.create(durable_stream("smp")).raise_for_status()
    r = kube.patch("DurableStream", NS, "smp", {"spec": {"replicas": 1}}, strategic=True)
    assert r.status_code == 415


def test_the_kubelet_stand_in_makes_a_pod_ready_only_once_its_gates_are_true(
    kube: Cluster, tmp_path: Path
) -> None:
    spec: dict[str, Any] = {"server": {"logFormat": "plain"}, "lifecycle": {}}
    sts = render_statefulset("gated", NS, "uid-1", spec)
    sts["spec"]["template"]["spec"]["readinessGates"] = [{"conditionType": GATE}]
    config = render_configmap("gated", NS, "uid-1", spec)
    for obj in (sts, config):  # no DurableStream owns them here (the collector would take them)
        obj["metadata"].pop("ownerReferences", None)
    probe = sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["periodSeconds"] = 1
    kube.create(config).raise_for_status()
    kube.create(sts).raise_for_status()
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gated", "namespace": NS},
        "spec": {"selector": sts["spec"]["selector"]["matchLabels"]},
    }
    kube.create(service).raise_for_status()
    with Kubelet(kube, NS, "gated", tmp_path, restart_delay=1.0) as kubelet:
        endpoints = ServiceEndpoints(kube, NS, "gated", kubelet.url_of)
        # The server answers its probe, but the gate's condition does not exist yet.
        ready = wait_for(
            lambda: (
                conditions(kube, "gated-0").get("ContainersReady", {}).get("status") == "True"
                and conditions(kube, "gated-0")
            ),
            timeout=60,
            message="the container ready",
        )
        assert ready["Ready"]["status"] == "False"
        assert ready["Ready"]["reason"] == "ReadinessGatesNotReady"
        assert GATE in ready["Ready"]["message"]
        assert endpoints.pods() == [] and kubelet.ready_pods() == []
        assert ready_replicas(kube) == 0

        set_gate(kube, "gated-0", True)
        wait_for(
            lambda: conditions(kube, "gated-0")["Ready"]["status"] == "True",
            message="Ready once the gate is True",
        )
        assert endpoints.pods() == ["gated-0"]
        wait_for(
            lambda: ready_replicas(kube) == 1,
            message="counted ready by the StatefulSet",
        )
        # The stand-in wrote Ready after the gate was set, and kept the gate as it was.
        assert conditions(kube, "gated-0")[GATE]["status"] == "True"

        set_gate(kube, "gated-0", False)
        wait_for(
            lambda: conditions(kube, "gated-0")["Ready"]["status"] == "False",
            message="not Ready once the gate is False",
        )
        assert conditions(kube, "gated-0")["Ready"]["reason"] == "ReadinessGatesNotReady"
        assert conditions(kube, "gated-0")["ContainersReady"]["status"] == "True"
        assert endpoints.pods() == []
        assert kubelet.ready_pods() == []
