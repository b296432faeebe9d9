"""The replica set the operator's whole-system tests run: a DurableStream named ``ledger``
of three replicas, its writers' streams, and how to read its status.

Shared by e2e/test_operator_replica_set.py (a kill and a roll under writers) and
e2e/test_operator_lifecycle.py (hibernation, fencing, deletion), which start the
same set.
"""

from __future__ import annotations

from typing import Any

from stream_operator import KIND
from testkit.cluster import Cluster

NS = "default"
NAME = "ledger"
STREAMS = ["orders/0", "orders/1"]
WRITERS = {"p0": STREAMS[0], "p1": STREAMS[0], "p2": STREAMS[1]}
# Short leases, so that a failover takes seconds; a renew deadline that leaves a primary
# three rounds to renew on a loaded machine (2 cores shared with other tests).
SPEC: dict[str, Any] = {
    "replicas": 3,
    "image": "durable-streams-server:0.1.0",
    "replication": {"leaseDurationSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
    # Plain HTTP: the kubelet stand-in reaches pods at 127.0.0.1, which the built-in CA's
    # certificate does not name (TLS over it: tests/replication/test_builtin_ca_set.py).
    "certificates": {"builtIn": False},
    "server": {"logFormat": "plain", "longPollTimeoutSeconds": 2},
    "lifecycle": {"terminationGracePeriodSeconds": 10, "readinessPeriodSeconds": 1},
}


def ds_status(kube: Cluster) -> dict[str, Any]:
    return (kube.get(KIND, NS, NAME) or {}).get("status") or {}


def settled(kube: Cluster, generation: int, after_term: int = 0) -> dict[str, Any] | None:
    """The status once the set is Ready at ``generation`` with every replica in sync and a
    primary elected after ``after_term``; None before."""
    st = ds_status(kube)
    if (
        st.get("phase") == "Ready"
        and st.get("observedGeneration") == generation
        and st.get("primary")
        and int(st.get("term") or 0) > after_term
        and st.get("inSyncReplicas") == 3
    ):
        return st
    return None
