"""The real kopf operator against an emulated API server (testkit.kube).

Each test starts an API server and the operator, acts the way a user would
(create, patch, delete DurableStreams through the API), plays the StatefulSet
controller where one is needed (status, PVCs), and checks what the operator
did to the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stream_operator import GROUP, KIND, VERSION
from testkit.kube import Cluster, cluster
from testkit.operator import running_operator

NS = "default"


def wait_for(what: Callable[[], Any], *, timeout: float = 20.0, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message or what}")
        time.sleep(0.1)


def durable_stream(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec or {},
    }


def play_statefulset_controller(c: Cluster, name: str, ready: int | None = None) -> None:
    """What the StatefulSet controller and kubelet would report: PVCs, then pod counts."""
    sts = c.get("StatefulSet", NS, name)
    want = sts["spec"]["replicas"]
    template = sts["spec"]["volumeClaimTemplates"][0]
    for ordinal in range(want):
        pvc_name = f"{template['metadata']['name']}-{name}-{ordinal}"
        if c.get("PersistentVolumeClaim", NS, pvc_name) is None:
            pvc = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": pvc_name,
                    "namespace": NS,
                    "labels": template["metadata"]["labels"],
                },
                "spec": template["spec"],
            }
            c.create(pvc).raise_for_status()
    ready = want if ready is None else ready
    revision = f"{name}-{sts['metadata']['generation']}"
    status = {
        "observedGeneration": sts["metadata"]["generation"],
        "replicas": want,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": want,
        "updatedReplicas": want,
        "currentRevision": revision,
        "updateRevision": revision,
    }
    c.patch("StatefulSet", NS, name, {"status": status}, status=True).raise_for_status()


def status_of(c: Cluster, name: str) -> dict[str, Any]:
    obj = c.get(KIND, NS, name) or {}
    return obj.get("status") or {}


def condition(c: Cluster, name: str, ctype: str) -> dict[str, Any]:
    for cond in status_of(c, name).get("conditions") or []:
        if cond["type"] == ctype:
            return cond
    return {}


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c, running_operator(c):
        yield c


def test_create_renders_every_object_with_owner_references(kube: Cluster):
    kube.create(durable_stream("events", {"replicas": 2})).raise_for_status()
    sts = wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    owner_uid = kube.get(KIND, NS, "events")["metadata"]["uid"]
    for kind, name in [
        ("ConfigMap", "events-config"),
        ("Service", "events"),
        ("Service", "events-headless"),
        ("PodDisruptionBudget", "events"),
        ("StatefulSet", "events"),
    ]:
        obj = wait_for(lambda k=kind, n=name: kube.get(k, NS, n), message=f"{kind} {name}")
        refs = obj["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs] == [owner_uid], (kind, name)
    assert sts["spec"]["replicas"] == 2
    # Nothing is ready yet: the status says so.
    wait_for(lambda: status_of(kube, "events").get("phase"), message="a phase")
    assert status_of(kube, "events")["readyReplicas"] == 0
    assert condition(kube, "events", "Ready")["status"] == "False"
    # The controller reports both pods ready: the status follows.
    play_statefulset_controller(kube, "events")
    wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", message="Ready")
    st = status_of(kube, "events")
    assert st["readyReplicas"] == 2
    assert st["endpoint"] == "http://events.default.svc:4437/v1/stream/"
    assert st["observedGeneration"] == 1
    events = [e for e in kube.list("Event", NS) if e["involvedObject"]["name"] == "events"]
    assert any(e["reason"] == "Created" for e in events), events
