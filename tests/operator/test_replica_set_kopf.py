"""Issue 16, part 1: the real kopf operator runs a replica set on the emulated API server.

The servers elect their primary through the Lease (docs/replication.md); here
the test writes that Lease as they would, plays the StatefulSet controller
and the kubelet (pods), and checks what the operator makes of it: the pods'
own RBAC and peer token, the role labels the client Services select on, the
status (primary, term, in-sync count, Degraded, FailingOver), the Events of a
failover, and a refused scale-down. (Rolling updates with a switchover, and
Spark on a standby: test_replica_set_rollout_kopf.py.)
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.operator import running_operator
from testkit.played_replica_set import NS, running_replica_set, set_ready, write_lease

pytestmark = pytest.mark.slow

ROLE = "streams.pyds.dev/role"


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c, running_operator(c):
        yield c


def status_of(c: Cluster) -> dict[str, Any]:
    return (c.get(KIND, NS, "events") or {}).get("status") or {}


def condition(c: Cluster, ctype: str) -> dict[str, Any]:
    return next((x for x in status_of(c).get("conditions") or [] if x["type"] == ctype), {})


def roles(c: Cluster) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get(ROLE)
        for p in c.list("Pod", NS)
    }


def events(c: Cluster, reason: str) -> list[str]:
    return [
        e["message"]
        for e in c.list("Event", NS)
        if e["involvedObject"]["name"] == "events" and e["reason"] == reason
    ]


def secret(c: Cluster) -> dict[str, Any] | None:
    r = c.http.get(f"/api/v1/namespaces/{NS}/secrets/events-replication")
    return r.json() if r.status_code == 200 else None


def test_a_replica_set_gets_its_rights_its_services_and_a_status_that_follows_the_lease(
    kube: Cluster,
):
    running_replica_set(kube, {"replicas": 3})
    sts = kube.get("StatefulSet", NS, "events")
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "events"
    binding = kube.get("RoleBinding", NS, "events")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "events", "namespace": NS}]
    assert kube.get("Role", NS, "events")["rules"][0]["resourceNames"] == ["events-leader"]
    assert kube.get("Service", NS, "events")["spec"]["selector"][ROLE] == "primary"
    assert kube.get("Service", NS, "events-replicas")["spec"]["selector"][ROLE] == "standby"
    assert kube.get("PodDisruptionBudget", NS, "events")["spec"]["maxUnavailable"] == 1
    # The peer token: made once, owned by the DurableStream, mounted into the pods.
    token = secret(kube)
    assert token is not None and len(base64.b64decode(token["data"]["token"])) == 43
    assert (
        token["metadata"]["ownerReferences"][0]["uid"]
        == kube.get(KIND, NS, "events")["metadata"]["uid"]
    )
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "replication",
        "secret": {"secretName": "events-replication", "defaultMode": 0o440},
    } in volumes
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    # Before any server took the Lease: no primary, too few in sync.
    wait_for(lambda: condition(kube, "Degraded").get("reason") == "TooFewInSync", message="-")
    wait_for(lambda: set(roles(kube).values()) == {"standby"}, message="standby labels")

    write_lease(kube, "events-0", 1, ["events-1", "events-2"])
    wait_for(lambda: status_of(kube).get("inSyncReplicas") == 3, message="three in sync")
    st = status_of(kube)
    assert (st["primary"], st["term"], st["phase"]) == ("events-0", 1, "Ready")
    assert [r["role"] for r in st["replicaStatus"]] == ["primary", "standby", "standby"]
    assert condition(kube, "Degraded")["status"] == "False"
    assert roles(kube) == {"events-0": "primary", "events-1": "standby", "events-2": "standby"}
    wait_for(lambda: events(kube, "PrimaryElected"), message="an Event for the election")

    assert condition(kube, "FailingOver")["status"] == "False"

    # The primary's pod stops being ready: failing over until a standby holds the Lease.
    set_ready(kube, sts, 0, False)
    wait_for(lambda: condition(kube, "FailingOver").get("status") == "True", message="FailingOver")
    assert condition(kube, "FailingOver")["reason"] == "PrimaryLost"
    assert (condition(kube, "Ready")["status"], status_of(kube)["phase"]) == ("False", "Degraded")
    # Failover: events-2 takes the Lease in term 2, events-0 is out of the in-sync set.
    write_lease(kube, "events-2", 2, ["events-1"])
    wait_for(lambda: status_of(kube).get("primary") == "events-2", message="the new primary")
    wait_for(lambda: condition(kube, "FailingOver").get("status") == "False", message="over")
    assert roles(kube) == {"events-0": "standby", "events-1": "standby", "events-2": "primary"}
    assert status_of(kube)["term"] == 2 and status_of(kube)["inSyncReplicas"] == 2
    assert condition(kube, "Degraded")["status"] == "False"  # 2 is a majority of 3
    changed = wait_for(lambda: events(kube, "PrimaryChanged"), message="an Event")
    assert changed == ["failover: primary events-0 -> events-2 (term 2)"]
    set_ready(kube, sts, 0, True)
    # The primary killed and back before the operator saw its pod not ready: the status
    # never says FailingOver, but its new term is a failover all the same.
    write_lease(kube, "events-2", 3, ["events-1"])
    wait_for(lambda: len(events(kube, "PrimaryChanged")) == 2, message="the second Event")
    assert events(kube, "PrimaryChanged")[1] == "failover: primary events-2 again (term 3)"
    # A primary that handed the Lease over by itself (a switchover asked of it directly,
    # or its hand-over as it stopped): a switchover, though this operator did not ask.
    write_lease(kube, "events-1", 4, ["events-2"], began="switchover")
    wait_for(lambda: len(events(kube, "PrimaryChanged")) == 3, message="the third Event")
    assert events(kube, "PrimaryChanged")[2] == (
        "switchover: primary events-2 -> events-1 (term 4), handed over by the primary"
    )
    assert status_of(kube)["termBegan"] == "switchover"
    write_lease(kube, "events-2", 5, ["events-1"], began="election")
    wait_for(lambda: len(events(kube, "PrimaryChanged")) == 4, message="the fourth Event")
    assert events(kube, "PrimaryChanged")[3] == "failover: primary events-1 -> events-2 (term 5)"
    # The token was never written again (no apply, no prune touches it).
    assert secret(kube)["metadata"]["resourceVersion"] == token["metadata"]["resourceVersion"]

    # The last standby falls behind: fewer in sync than a majority.
    write_lease(kube, "events-2", 5, [])
    wait_for(lambda: condition(kube, "Degraded").get("status") == "True", message="Degraded")
    assert (
        condition(kube, "Degraded")["message"] == "1 replica(s) in sync (events-2), minInSync is 2"
    )


def test_a_scale_down_below_the_in_sync_count_is_refused_with_the_reason(kube: Cluster):
    """The CRD's rule refuses it (422); on a cluster whose CRD has no CEL rules, the
    operator's own check refuses."""
    running_replica_set(kube, {"replicas": 3, "replication": {"minInSync": 3}})
    write_lease(kube, "events-0", 1, ["events-1", "events-2"])
    wait_for(lambda: status_of(kube).get("phase") == "Ready", message="Ready")
    assert kube.patch(KIND, NS, "events", {"spec": {"replicas": 2}}).status_code == 422
    kube.serve_crd_without_rules()
    kube.patch(KIND, NS, "events", {"spec": {"replicas": 2}}).raise_for_status()
    wait_for(lambda: condition(kube, "Accepted").get("status") == "False", message="refused")
    accepted = condition(kube, "Accepted")
    assert accepted["reason"] == "ChangeRefused"
    assert "minInSync (3) is more than replicas (2)" in accepted["message"]
    assert kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 3
    assert condition(kube, "Ready")["status"] == "False"
    kube.wait_for_event(NS, "events", "ChangeRefused")  # created by the refusing handler


def test_one_replica_gets_no_pod_rights_and_no_role_labels(kube: Cluster):
    running_replica_set(kube, {"replicas": 1})
    wait_for(lambda: status_of(kube).get("phase") == "Ready", message="Ready")
    assert kube.get("ServiceAccount", NS, "events") is None
    assert kube.get("Service", NS, "events-replicas") is None
    assert roles(kube) == {"events-0": None}
    assert "primary" not in status_of(kube)


def test_a_scale_down_that_would_remove_the_primary_waits_for_a_failover(kube: Cluster):
    running_replica_set(kube, {"replicas": 3})
    write_lease(kube, "events-2", 4, ["events-0", "events-1"])
    wait_for(lambda: status_of(kube).get("primary") == "events-2", message="events-2 primary")
    kube.patch(KIND, NS, "events", {"spec": {"replicas": 2}}).raise_for_status()
    wait_for(lambda: condition(kube, "Accepted").get("status") == "False", message="refused")
    assert "would remove the primary events-2" in condition(kube, "Accepted")["message"]
    assert kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 3
    # The user fails over (deletes the primary's pod); events-0 takes the Lease.
    write_lease(kube, "events-0", 5, ["events-1"])
    wait_for(
        lambda: kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 2,
        message="the scale-down carried out after the failover",
    )
    wait_for(lambda: condition(kube, "Accepted").get("status") == "True", message="accepted")
