"""The operator's backstop for the in-sync readiness gate (issue 25): which pod conditions
it writes from the Lease. The Lease holder sets them first (stream_server.replication.
pod_labels); the operator writes only where a pod's condition says otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stream_operator.decisions.replica_roles import LeaseView, in_sync_changes
from stream_operator.specs.render import IN_SYNC
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.operator import running_operator
from testkit.played_replica_set import NS, running_replica_set, write_lease

pytestmark = pytest.mark.slow


def pod(name: str, in_sync: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if in_sync is not None:
        conditions.append({"type": IN_SYNC, "status": in_sync})
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def test_the_holder_and_the_in_sync_standbys_are_true_the_others_false() -> None:
    view = LeaseView(holder="ds-0", term=3, in_sync=("ds-2",))
    pods = [pod("ds-0"), pod("ds-1"), pod("ds-2")]
    assert in_sync_changes(view, pods, IN_SYNC) == [
        ("ds-0", True),
        ("ds-1", False),
        ("ds-2", True),
    ]


def test_only_what_differs_is_written() -> None:
    view = LeaseView(holder="ds-0", term=3, in_sync=("ds-2",))
    pods = [pod("ds-0", "True"), pod("ds-1", "True"), pod("ds-2", "True")]
    assert in_sync_changes(view, pods, IN_SYNC) == [("ds-1", False)]  # fell out of the set
    pods = [pod("ds-0", "True"), pod("ds-1", "False"), pod("ds-2", "True")]
    assert in_sync_changes(view, pods, IN_SYNC) == []


def test_no_holder_decides_nothing() -> None:
    assert in_sync_changes(LeaseView(), [pod("ds-0"), pod("ds-1", "True")], IN_SYNC) == []


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c, running_operator(c):
        yield c


def gate(c: Cluster) -> dict[str, str | None]:
    """Each pod's in-sync condition status (None: none)."""
    out: dict[str, str | None] = {}
    for p in c.list("Pod", NS):
        conds = {x["type"]: x for x in (p.get("status") or {}).get("conditions") or []}
        out[p["metadata"]["name"]] = conds.get(IN_SYNC, {}).get("status")
    return out


def test_the_operator_sets_the_gate_from_the_lease_where_no_server_did(kube: Cluster) -> None:
    """No server runs here (the test writes the Lease): the operator's status round alone
    sets the condition, and changes it as the Lease's in-sync set does."""
    running_replica_set(kube, {"replicas": 3})
    assert gate(kube) == {"events-0": None, "events-1": None, "events-2": None}  # no holder
    write_lease(kube, "events-0", 1, ["events-2"])
    want = {"events-0": "True", "events-1": "False", "events-2": "True"}
    wait_for(lambda: gate(kube) == want, message=lambda: f"the gate from the Lease: {gate(kube)}")
    write_lease(kube, "events-0", 1, [])
    want = {"events-0": "True", "events-1": "False", "events-2": "False"}
    wait_for(lambda: gate(kube) == want, message=lambda: f"events-2 out of sync: {gate(kube)}")
