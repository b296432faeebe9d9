"""The replica set ``events`` of the kopf tests, with the test playing everyone but the
operator: the StatefulSet controller and the kubelet (claims, pods, readiness,
the StatefulSet's status) and the servers (the Lease they write).

Shared by tests/operator/test_replica_set_kopf.py (rights, Services, status,
failover Events, scale-downs) and test_in_sync_gate.py (the in-sync condition the
operator writes from the Lease).
"""

from __future__ import annotations

from typing import Any

from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.leases import write_replica_lease
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

NS = "default"


def write_lease(c: Cluster, holder: str, term: int, in_sync: list[str], began: str = "") -> None:
    """The Lease ``events-leader`` as the servers would write it."""
    write_replica_lease(c, "events", NS, holder, term, in_sync, began)


def set_ready(c: Cluster, sts: dict[str, Any], ordinal: int, ready: bool) -> None:
    """The kubelet's report of a pod's readiness."""
    status = pod_status(sts["spec"]["template"]["spec"]["containers"][0], ready=ready, restarts=0)
    c.patch("Pod", NS, f"events-{ordinal}", {"status": status}, status=True).raise_for_status()


def running_replica_set(c: Cluster, spec: dict[str, Any]) -> None:
    """Create the DurableStream, then do what the StatefulSet controller and kubelet would."""
    c.create(durable_stream("events", spec)).raise_for_status()
    sts = wait_for(lambda: c.get("StatefulSet", NS, "events"), message="the StatefulSet")
    claim_volumes(c, sts)
    for i in range(sts["spec"]["replicas"]):
        c.create(pod_object(sts, i)).raise_for_status()
        set_ready(c, sts, i, True)
    want = sts["spec"]["replicas"]
    rev = f"events-{sts['metadata']['generation']}"
    status = statefulset_status(sts, want, want, want, rev, rev)
    c.patch("StatefulSet", NS, "events", {"status": status}, status=True).raise_for_status()
