"""End to end on an emulated cluster: operator -> StatefulSet -> real server processes.

The test plays the kubelet (testkit.kubelet): the StatefulSet the operator
renders becomes real ``stream_server`` processes with the rendered args and
ConfigMap env, one data directory per PVC. Real HTTP traffic goes through
them; the DurableStream's status must follow what they really do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator import KIND
from testkit import wait_for as _wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.operator import running_operator

pytestmark = pytest.mark.processes

NS = "default"


def wait_for(what, *, message: str):
    """Real processes start slower than emulated objects: a longer patience."""
    return _wait_for(what, timeout=60, message=message)


def status(kube: Cluster) -> dict[str, Any]:
    return (kube.get(KIND, NS, "events") or {}).get("status") or {}


def phase_is(kube: Cluster, phase: str, ready: int) -> bool:
    st = status(kube)
    return st.get("phase") == phase and (st.get("readyReplicas") or 0) == ready


def test_status_follows_real_server_pods(tmp_path: Path):
    # One replica: more make a replica set, whose servers elect a primary through a
    # Lease (tests/operator/test_replica_set_kopf.py, tests/replication).
    spec = {"replicas": 1, "server": {"maxBodyBytes": 1024, "logFormat": "plain"}}
    with (
        cluster() as kube,
        running_operator(kube),
        Kubelet(kube, NS, "events", tmp_path, restart_delay=3.0) as kubelet,
    ):
        kube.create(durable_stream("events", spec)).raise_for_status()
        wait_for(lambda: phase_is(kube, "Ready", 1), message="Ready with its server")
        assert status(kube)["endpoint"] == "http://events.default.svc:4437/v1/stream/"
        assert {c["type"]: c["status"] for c in status(kube)["conditions"]} == {
            "Ready": "True",
            "Progressing": "False",
            "Degraded": "False",
            "Accepted": "True",
        }

        # Real traffic through every pod; the spec's body limit reached the servers.
        pods = {p.ordinal: p for p in kubelet.ready_pods()}
        for pod in pods.values():
            url = f"{pod.url}/v1/stream/orders"
            assert httpx.put(url, headers={"Content-Type": "text/plain"}).status_code == 201
            assert httpx.post(
                url, content=b"first", headers={"Content-Type": "text/plain"}
            ).is_success
            too_big = httpx.post(url, content=b"x" * 2000, headers={"Content-Type": "text/plain"})
            assert too_big.status_code == 413
            assert httpx.get(url, params={"offset": "-1"}).content == b"first"

        # A pod dies: the status degrades, then recovers when its replacement is ready,
        # and the replacement finds what was acknowledged on its volume.
        kubelet.delete_pod(0)
        wait_for(lambda: phase_is(kube, "Degraded", 0), message="Degraded with no server")
        degraded = {c["type"]: c for c in status(kube)["conditions"]}["Degraded"]
        assert degraded["status"] == "True" and degraded["reason"] == "PodsNotReady"
        wait_for(lambda: phase_is(kube, "Ready", 1), message="Ready again")
        pod0 = {p.ordinal: p for p in kubelet.ready_pods()}[0]
        assert pod0.port != pods[0].port  # a new process
        assert httpx.get(f"{pod0.url}/v1/stream/orders", params={"offset": "-1"}).content == (
            b"first"
        )

        # A setting change rolls the pod; the new limit is in force after. (One pod rolls in
        # a few seconds, too short to be sure to see "Progressing" in the status: the status
        # tests cover that phase; here a new process shows the roll.)
        kube.patch(KIND, NS, "events", {"spec": {"server": {"maxBodyBytes": 4096}}})
        wait_for(
            lambda: (
                phase_is(kube, "Ready", 1)
                and status(kube).get("observedGeneration") == 2
                and [p.port for p in kubelet.ready_pods()] not in ([], [pod0.port])
            ),
            message="Ready on a new pod after the rollout",
        )
        for pod in kubelet.ready_pods():
            url = f"{pod.url}/v1/stream/orders"
            ok = httpx.post(url, content=b"y" * 2000, headers={"Content-Type": "text/plain"})
            assert ok.is_success, ok.text
            assert httpx.get(url, params={"offset": "-1"}).content == b"first" + b"y" * 2000

        # Deleting the DurableStream takes the pods away (their StatefulSet is collected).
        kube.delete(KIND, NS, "events").raise_for_status()
        wait_for(lambda: not kubelet.pods, message="the pods gone")
        assert kube.get("StatefulSet", NS, "events") is None
