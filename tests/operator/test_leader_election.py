"""Issue 15, finding 9: one active operator, even when two pods overlap.

Two real ``durable-streams-operator`` processes (``python -m stream_operator``)
run against the emulated API server, which now does what leader election
needs from kube-apiserver: Leases, updates that replace, and 409 Conflict on
a stale resourceVersion (checked first, below). The second process waits
while the first holds the Lease; a first process frozen with SIGSTOP (a
partition: it cannot renew) loses the Lease to the second, which takes over;
thawed, the first writes nothing and exits 1 (its pod restarts as a standby);
a leader stopped by SIGTERM releases the Lease at once.

Which process wrote what is told by the User-Agent of the handlers' client,
which names the pod (``durable-streams-operator (op-a)``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from stream_operator import KIND
from stream_operator.specs.render import render_role
from testkit import free_port, rbac, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import Call, durable_stream
from testkit.pod_objects import claim_volumes, statefulset_status

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from get_tools import ensure  # noqa: E402

pytestmark = pytest.mark.processes

NS = "default"
LEASE = "durable-streams-operator"
WRITES = ("create", "patch", "update", "delete")


def lease(c: Cluster) -> dict[str, Any]:
    return c.get("Lease", NS, LEASE) or {}


def holder(c: Cluster) -> str | None:
    return (lease(c).get("spec") or {}).get("holderIdentity")


def test_the_emulator_refuses_a_stale_update_as_kube_apiserver_does():
    """Compare-and-swap: an update naming an old resourceVersion is a 409 Conflict."""
    with cluster() as c:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "l", "namespace": NS},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        }
        c.create(body).raise_for_status()
        first = c.get("Lease", NS, "l")
        mine = {**first, "spec": {**first["spec"], "holderIdentity": "b"}}
        took = c.http.put(c.path("Lease", NS, "l"), json=mine)
        assert took.status_code == 200, took.text
        assert took.json()["spec"]["holderIdentity"] == "b"
        # The same update from a candidate that read the Lease before "b" took it.
        stale = {**first, "spec": {**first["spec"], "holderIdentity": "c"}}
        refused = c.http.put(c.path("Lease", NS, "l"), json=stale)
        assert refused.status_code == 409, refused.text
        assert refused.json()["reason"] == "Conflict"
        assert holder_of(c, "l") == "b"
        # An update replaces: a field left out is gone (a merge would have kept it).
        current = c.get("Lease", NS, "l")
        current["spec"] = {"holderIdentity": "b"}
        c.http.put(c.path("Lease", NS, "l"), json=current).raise_for_status()
        assert "leaseDurationSeconds" not in c.get("Lease", NS, "l")["spec"]


def holder_of(c: Cluster, name: str) -> str | None:
    return ((c.get("Lease", NS, name) or {}).get("spec") or {}).get("holderIdentity")


class Operator:
    """One ``durable-streams-operator`` process, as a pod named ``pod`` runs it."""

    def __init__(self, c: Cluster, pod: str, kubeconfig: Path, logs: Path) -> None:
        self.pod = pod
        self.port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "POD_NAME": pod,
            "POD_NAMESPACE": NS,
            "DS_OPERATOR_STATUS_INTERVAL": "1",
            "DS_OPERATOR_RESYNC_INTERVAL": "1",
        }
        self.log = logs / f"{pod}.log"
        args = [sys.executable, "-m", "stream_operator", "--metrics-address", "127.0.0.1"]
        args += ["--metrics-port", str(self.port)]
        # Short enough for a test, long enough for a loaded machine to renew in time.
        args += ["--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "1"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)

    def leader_gauge(self) -> float | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except httpx.TransportError:
            return None
        for line in text.splitlines():
            if line.startswith("durable_streams_operator_leader "):
                return float(line.split()[1])
        return None

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def writes(self, calls: list[Call]) -> list[Call]:
        """What this process wrote, the Lease aside."""
        return [
            call
            for call in calls
            if f"({self.pod})" in call.agent and call.verb in WRITES and call.resource != "leases"
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Cluster, Any]]:
    with cluster() as c:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulated", "cluster": {"server": c.url}}],
            "users": [{"name": "operator", "user": {}}],
            "contexts": [
                {"name": "emulated", "context": {"cluster": "emulated", "user": "operator"}}
            ],
            "current-context": "emulated",
        }
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        started: list[Operator] = []

        def start(pod: str) -> Operator:
            op = Operator(c, pod, kubeconfig, tmp_path)
            started.append(op)
            return op

        try:
            yield c, start
        finally:
            for op in started:
                op.stop()
            for op in started:
                print(f"--- {op.pod}\n{op.log.read_text()[-3000:]}")


def play_statefulset_controller(c: Cluster, name: str) -> None:
    sts = c.get("StatefulSet", NS, name)
    want = sts["spec"]["replicas"]
    claim_volumes(c, sts)
    rev = f"{name}-{sts['metadata']['generation']}"
    status = statefulset_status(sts, want, want, want, rev, rev)
    c.patch("StatefulSet", NS, name, {"status": status}, status=True).raise_for_status()


def test_a_second_operator_waits_and_takes_over_only_when_the_first_is_gone(two):
    c, start = two
    a = start("op-a")
    wait_for(lambda: holder(c) == "op-a", message="op-a holds the lease")
    b = start("op-b")
    wait_for(lambda: b.leader_gauge() == 0.0, message="op-b up, as a standby")
    assert b.healthy()  # a standby is alive: its liveness probe must not restart it
    c.create(durable_stream("events")).raise_for_status()
    wait_for(lambda: c.get("StatefulSet", NS, "events"), message="op-a reconciles")
    play_statefulset_controller(c, "events")
    # op-a renews the Lease several times while op-b campaigns: op-b stays out.
    renewed = int(lease(c)["metadata"]["resourceVersion"])
    wait_for(
        lambda: (
            holder(c) == "op-a"
            and (ds := c.get(KIND, NS, "events"))
            and (ds.get("status") or {}).get("phase") == "Ready"
            and int(lease(c)["metadata"]["resourceVersion"]) > renewed + 3
        ),
        message="Ready, and the lease renewed by op-a",
    )
    calls = list(c.api.requests)
    assert a.writes(calls), "op-a did the work"
    assert b.writes(calls) == [], "the standby wrote"
    assert a.leader_gauge() == 1.0 and b.leader_gauge() == 0.0

    # A partition: op-a cannot renew. op-b takes the Lease once it runs out, and acts.
    a.proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: holder(c) == "op-b", message="op-b takes the lease", timeout=30)
    c.patch(KIND, NS, "events", {"spec": {"replicas": 2}}).raise_for_status()
    wait_for(
        lambda: c.get("StatefulSet", NS, "events")["spec"]["replicas"] == 2,
        message="op-b reconciles",
    )
    assert b.writes(list(c.api.requests))
    # op-a comes back: it finds the Lease gone, writes nothing, and exits 1.
    seen = len(c.api.requests)
    a.proc.send_signal(signal.SIGCONT)
    assert a.proc.wait(30) == 1
    wrote = a.writes(c.api.requests[seen:])
    assert wrote == [], f"op-a wrote after it was thawed: {wrote}"
    assert holder(c) == "op-b"

    # A leader stopped by SIGTERM gives the Lease up at once (not after it runs out).
    b.proc.send_signal(signal.SIGTERM)
    assert b.proc.wait(30) == 0
    assert holder(c) is None

    # The Lease calls are what the chart's leader-election Role grants (both ways).
    helm = str(ensure() / "helm")
    out = subprocess.run(
        [helm, "template", "rel", str(ROOT / "charts" / "durable-streams"), "--namespace", NS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    granted = rbac.grants(yaml.safe_load_all(out), "rel-durable-streams", NS)
    lease_calls = [call for call in c.api.requests if call.resource == "leases"]
    assert rbac.denied(lease_calls, granted) == []
    # Unused by the operator, a lease right may only be one it holds to grant it to the
    # replica sets' servers (Kubernetes lets it grant no more than it holds).
    for_servers = {
        verb
        for rule in render_role("x", NS, "uid", {})["rules"]
        if "leases" in rule["resources"]
        for verb in rule["verbs"]
    }
    # And delete and patch: a replica set's Lease goes at a scale-down to one (scaling.py),
    # and gets its owner reference to the DurableStream (lease_owner.py), calls
    # test_rbac.py sees the operator make.
    unused = rbac.unused(lease_calls, {g for g in granted if g.resource == "leases"})
    assert [g for g in unused if g.verb not in for_servers | {"delete", "patch"}] == []
