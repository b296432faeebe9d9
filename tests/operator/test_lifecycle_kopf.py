"""The lifecycle annotations under the real kopf operator against the emulated API server:
``streams.pyds.dev/reconcile: paused`` holds every change until it is removed, and a single
server is fenced through its pod's annotation, which the kubelet stand-in writes into the
pod's downwardAPI volume (the 3-replica cases: e2e/test_operator_lifecycle.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator import KIND
from stream_operator.decisions.lifecycle import FENCED_INSTANCES, HIBERNATION, POD_FENCED, RECONCILE
from stream_server.fencing import parse_annotations
from testkit import rbac, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.operator import running_operator
from testkit.operator_rbac import cluster_wide_rbac

pytestmark = pytest.mark.processes

NS = "default"


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        with running_operator(c):
            yield c
        # What the lifecycle needs (pods annotated, a StatefulSet scaled) is granted.
        granted = rbac.grants(cluster_wide_rbac(), "durable-streams", "durable-streams")
        calls = [call for call in c.api.requests if not call.agent.startswith("python-httpx/")]
        assert not rbac.denied(calls, granted)


def status_of(c: Cluster, name: str) -> dict[str, Any]:
    return (c.get(KIND, NS, name) or {}).get("status") or {}


def condition(c: Cluster, name: str, ctype: str) -> dict[str, Any]:
    conds = status_of(c, name).get("conditions") or []
    return next((x for x in conds if x["type"] == ctype), {})


def events(c: Cluster, name: str, reason: str) -> list[str]:
    return [
        e["message"]
        for e in c.list("Event", NS)
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


def operator_reads(c: Cluster) -> int:
    """How many times the operator has read a DurableStream (once per round at least)."""
    return sum(
        1
        for call in c.api.requests
        if call.resource == "durablestreams"
        and call.verb == "get"
        and not call.agent.startswith("python-httpx/")
    )


def annotate(c: Cluster, name: str, key: str, value: str | None) -> None:
    c.patch(KIND, NS, name, {"metadata": {"annotations": {key: value}}}).raise_for_status()


def test_a_paused_object_gets_nothing_applied_until_it_is_resumed(kube: Cluster):
    kube.create(durable_stream("events")).raise_for_status()
    sts = wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    wait_for(lambda: status_of(kube, "events").get("phase"), message="a status")

    annotate(kube, "events", RECONCILE, "paused")
    wait_for(
        lambda: condition(kube, "events", "ReconcilePaused").get("status") == "True",
        message="ReconcilePaused",
    )
    assert events(kube, "events", "ReconcilePaused")
    phase = status_of(kube, "events")["phase"]
    # A spec change and a deleted Service: neither is carried out while paused.
    kube.patch(KIND, NS, "events", {"spec": {"image": "durable-streams-server:9.9"}})
    kube.delete("Service", NS, "events").raise_for_status()
    reads = operator_reads(kube)
    wait_for(lambda: operator_reads(kube) >= reads + 5, message="five more operator rounds")
    sts = kube.get("StatefulSet", NS, "events")
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert kube.get("Service", NS, "events") is None
    assert status_of(kube, "events")["phase"] == phase
    assert condition(kube, "events", "ReconcilePaused")["status"] == "True"

    annotate(kube, "events", RECONCILE, None)
    wait_for(lambda: kube.get("Service", NS, "events"), message="the Service back")
    wait_for(
        lambda: (
            kube.get("StatefulSet", NS, "events")["spec"]["template"]["spec"]["containers"][0][
                "image"
            ]
            == "durable-streams-server:9.9"
        ),
        message="the new image applied",
    )
    wait_for(lambda: not condition(kube, "events", "ReconcilePaused"), message="resumed")
    assert events(kube, "events", "ReconcileResumed")


def test_a_fenced_server_leaves_its_services_and_comes_back_when_unfenced(
    kube: Cluster, tmp_path: Path
):
    kube.create(durable_stream("events")).raise_for_status()
    wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    with Kubelet(kube, NS, "events", tmp_path, restart_delay=0.5) as kubelet:
        wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", timeout=60)
        server = kubelet.pods[0]
        pid = server.proc.pid
        annotations = tmp_path / "pods" / "events-0" / "podinfo" / "annotations"
        assert POD_FENCED not in parse_annotations(annotations.read_text())

        annotate(kube, "events", FENCED_INSTANCES, '["events-0"]')
        wait_for(
            lambda: parse_annotations(annotations.read_text()).get(POD_FENCED) == "true",
            message="the fence in the pod's downward API file",
        )
        wait_for(lambda: not server.ready, timeout=60, message="the fenced pod not ready")
        wait_for(lambda: condition(kube, "events", "Fenced").get("status") == "True")
        assert events(kube, "events", "Fenced")
        # The list the pods mount, for a pod made later; reconciles (every second here)
        # do not prune it as an object they no longer render.
        fence_list = kube.get("ConfigMap", NS, "events-fence")
        assert fence_list["data"] == {"fenced-instances": '["events-0"]'}
        reads = operator_reads(kube)
        wait_for(lambda: operator_reads(kube) >= reads + 3, message="three more rounds")
        assert (
            kube.get("ConfigMap", NS, "events-fence")["metadata"]["uid"]
            == (fence_list["metadata"]["uid"])
        )
        r = httpx.get(f"{server.url}/v1/stream/x", timeout=5)
        assert r.status_code == 503 and r.json()["error"]["code"] == "FENCED"
        assert server.proc.pid == pid and server.restarts == 0 and kubelet.pods[0] is server

        annotate(kube, "events", FENCED_INSTANCES, None)
        # "false", not removed: the annotation decides over the list (fencing.py).
        wait_for(
            lambda: parse_annotations(annotations.read_text()).get(POD_FENCED) == "false",
            message="the fence lifted in the pod's downward API file",
        )
        wait_for(lambda: server.ready, timeout=60, message="the pod ready again")
        wait_for(
            lambda: kube.get("ConfigMap", NS, "events-fence")["data"]["fenced-instances"] == "[]",
            message="the list emptied",
        )
        wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", timeout=60)
        assert server.proc.pid == pid and server.restarts == 0
        assert not condition(kube, "events", "Fenced")
        assert events(kube, "events", "Unfenced")


def test_hibernation_goes_through_a_refused_spec(kube: Cluster):
    """A refused change (a smaller volume, on a cluster whose CRD has no CEL rules: the
    operator refuses it) leaves the servers as they are, but hibernating and waking
    change no data and are carried out all the same."""
    kube.create(durable_stream("events", {"storage": {"size": "2Gi"}})).raise_for_status()
    wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    kube.serve_crd_without_rules()
    kube.patch(KIND, NS, "events", {"spec": {"storage": {"size": "1Gi"}}}).raise_for_status()
    wait_for(lambda: condition(kube, "events", "Accepted").get("reason") == "ChangeRefused")
    annotate(kube, "events", HIBERNATION, "on")
    wait_for(
        lambda: kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 0,
        message="the StatefulSet at 0 replicas",
    )
    assert condition(kube, "events", "Accepted").get("reason") == "ChangeRefused"
    annotate(kube, "events", HIBERNATION, "off")
    wait_for(
        lambda: kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 1,
        message="the StatefulSet back at 1 replica",
    )
