"""Issue 42: a replica set's Lease goes with its DurableStream.

The servers create ``<name>-leader``; nothing deleted it with the DurableStream, so a
DurableStream made again under the same name (after ``pvcRetention: Delete``: empty
volumes) found the old set's Lease, its set id and terms, and might never elect. The
operator's round now adds an owner reference to the Lease once it exists
(``stream_operator.controllers.lease_owner``), the servers' renewals keep it
(``tests/replication/test_lease_metadata.py``), and the garbage collector (the
emulator's, background propagation) deletes the Lease with its owner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from stream_operator import KIND
from stream_operator.controllers import lease_owner, reconcile, status_round
from stream_operator.controllers.periodic import Periodic
from stream_operator.kube import events
from stream_server.replication.lease.kube_lease import LeaseClient
from testkit import rbac
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.leases import replica_lease
from testkit.operator_rbac import cluster_wide_rbac

NS = "default"


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    for kind in ("info", "warn"):  # the Events are not what these tests check
        monkeypatch.setattr(events, kind, lambda *_, **__: None)
    with cluster() as c:
        yield c


def api_client(c: Cluster) -> client.ApiClient:
    return client.ApiClient(client.Configuration(host=c.url))


def rounds() -> Periodic:
    return Periodic(lambda *_: None)


def refs(c: Cluster, name: str) -> list[dict[str, Any]]:
    lease = c.get("Lease", NS, f"{name}-leader") or {}
    return list(lease.get("metadata", {}).get("ownerReferences") or [])


def lease_writes(c: Cluster, start: int) -> list[str]:
    """The operator's writes to Leases since request ``start``."""
    return [
        call.verb
        for call in c.api.requests[start:]
        if call.resource == "leases"
        and call.verb in ("patch", "update")
        and call.agent.startswith("OpenAPI-Generator")
    ]


def renew(c: Cluster, name: str) -> None:
    """One renewal as the holder writes it: the server's own client, read then replace."""

    async def go() -> None:
        lease = LeaseClient(f"{NS}/{name}-leader", c.url)
        try:
            record = await lease.get()
            assert record is not None
            record.renew_time = "2030-01-01T00:00:00.000000Z"
            await lease.replace(record)
        finally:
            await lease.close()

    asyncio.run(go())


def test_the_lease_gets_its_owner_once_and_goes_with_the_durable_stream(kube: Cluster):
    ac = api_client(kube)
    ds = kube.create(durable_stream("events", {"replicas": 3})).json()
    reconcile.converge(ac, "events", NS, logging.getLogger("test"), rounds())
    assert kube.get("StatefulSet", NS, "events") is not None
    assert kube.get("Lease", NS, "events-leader") is None  # no server yet: nothing to own

    kube.create(replica_lease("events", NS, "events-0", 1, ["events-1"])).raise_for_status()
    status_round.refresh(ac, "events", NS, rounds())
    assert refs(kube, "events") == [lease_owner.lease_reference(ds)]
    (ref,) = refs(kube, "events")
    assert ref["uid"] == ds["metadata"]["uid"] and ref["controller"] is False

    start = len(kube.api.requests)
    status_round.refresh(ac, "events", NS, rounds())
    reconcile.converge(ac, "events", NS, logging.getLogger("test"), rounds())
    assert lease_writes(kube, start) == []  # once: a Lease that has it is not written

    renew(kube, "events")  # the servers keep the reference (their PUT carries it)
    assert refs(kube, "events") == [lease_owner.lease_reference(ds)]

    kube.delete(KIND, NS, "events").raise_for_status()
    assert kube.get(KIND, NS, "events") is None
    assert kube.get("Lease", NS, "events-leader") is None  # collected with its owner
    assert kube.get("StatefulSet", NS, "events") is None


def test_other_owners_are_kept_and_a_race_or_a_missing_lease_waits(kube: Cluster):
    ac = api_client(kube)
    ds = kube.create(durable_stream("events", {"replicas": 3})).json()
    other = kube.create(durable_stream("other")).json()
    theirs = {**lease_owner.lease_reference(other), "blockOwnerDeletion": False}
    lease = replica_lease("events", NS, "events-0")
    lease["metadata"]["ownerReferences"] = [theirs]
    read = kube.create(lease).json()

    # A server wrote the Lease after the round read it: 409, left for the next round.
    kube.patch("Lease", NS, "events-leader", {"spec": {"renewTime": "2030-01-01T00:00:00Z"}})
    assert lease_owner.adopt_lease(ac, ds, read) == read
    assert refs(kube, "events") == [theirs]

    adopted = lease_owner.adopt_lease(ac, ds, kube.get("Lease", NS, "events-leader"))
    assert adopted is not None
    assert refs(kube, "events") == [theirs, lease_owner.lease_reference(ds)]
    assert adopted["metadata"]["ownerReferences"] == refs(kube, "events")

    # Gone since it was read (a scale-down to one replica deletes it): nothing to own.
    stale = kube.get("Lease", NS, "events-leader")
    assert stale is not None
    stale["metadata"]["ownerReferences"] = []
    kube.delete("Lease", NS, "events-leader").raise_for_status()
    assert lease_owner.adopt_lease(ac, ds, stale) is None
    assert lease_owner.adopt_lease(ac, ds, None) is None


def test_the_installed_rbac_grants_the_adoption(kube: Cluster):
    """The patch and the admission plugin's checks on it (``delete`` on the Lease for a
    change of owner references, ``update`` on the DurableStream's finalizers for a
    reference that blocks its deletion) are granted by the chart's cluster-wide RBAC."""
    ac = api_client(kube)
    ds = kube.create(durable_stream("events", {"replicas": 3})).json()
    lease = kube.create(replica_lease("events", NS, "events-0")).json()
    start = len(kube.api.requests)
    lease_owner.adopt_lease(ac, ds, lease)
    calls = kube.api.requests[start:]
    asked = {(call.verb, call.resource) for call in calls}
    assert asked == {
        ("patch", "leases"),
        ("delete", "leases"),
        ("update", "durablestreams/finalizers"),
    }
    granted = rbac.grants(cluster_wide_rbac(), "durable-streams", "durable-streams")
    assert rbac.denied(calls, granted) == []
