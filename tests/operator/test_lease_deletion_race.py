"""Issue 42: a deleted DurableStream's Lease must not outlive it.

The Lease is a dependent of its DurableStream (``lease_owner``), so the garbage
collector deleted it with the StatefulSet, while the pods were still terminating. A
server still running then found its Lease gone and created it again, with no owner (it
had no Lease left to copy the reference from, ``stream_server.replication.lease.lease_writes``):
that Lease outlived the DurableStream, and a DurableStream made again under the same
name on new, empty volumes (``pvcRetention: Delete``) found a Lease naming the old set's
id and terms. The deletion handler now deletes the StatefulSet, waits for the pods to
be gone, and only then deletes the Lease and the claims (``lifecycle_deletion``).

The test plays each part against the emulated API server: the operator's delete handler
as kopf calls it (again after each TemporaryError, the finalizer removed once it
returns), the StatefulSet controller and kubelet (a pod deleted once its StatefulSet is
gone, gone once its grace period is over, stood in for by a finalizer), and a server of
each pod (the server's own Lease client: a renewal while its Lease exists, a create when
it finds it gone, as ``lease_writes._create`` does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import kopf
import pytest
from kubernetes import client

from stream_operator import GROUP, KIND
from stream_operator.controllers import handlers, reconcile, status_round
from stream_operator.controllers.periodic import Periodic
from stream_operator.kube import events
from stream_operator.kube.api_client import use_api_client
from stream_server.replication.lease.kube_lease import LeaseClient, LeaseRecord, micro_time
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.leases import replica_lease
from testkit.pod_objects import statefulset_status

NS = "default"
FINALIZER = f"{GROUP}/finalizer"  # kopf's, as handlers.configure names it
GRACE = "testkit/grace-period"  # a terminating pod's server still runs while this holds it
PODS = [f"events-{i}" for i in range(3)]


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    for kind in ("info", "warn"):  # the Events are not what these tests check
        monkeypatch.setattr(events, kind, lambda *_, **__: None)
    with cluster() as c:
        ac = client.ApiClient(client.Configuration(host=c.url))
        use_api_client(ac)
        yield c


def pod(name: str) -> dict:
    labels = {"app.kubernetes.io/instance": "events", "app.kubernetes.io/name": "durable-streams"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "finalizers": [GRACE]},
        "spec": {"containers": [{"name": "server", "image": "x"}]},
    }


def a_server_writes(c: Cluster) -> None:
    """events-0's server, while its pod exists (terminating or not): it renews its Lease,
    or creates it again when it finds it gone."""
    if c.get("Pod", NS, "events-0") is None:
        return

    async def go() -> None:
        lease = LeaseClient(f"{NS}/events-leader", c.url)
        try:
            record = await lease.get()
            if record is None:
                now = micro_time()
                fresh = LeaseRecord(
                    holder="events-0", renew_time=now, acquire_time=now, term=3, set_id="old-set"
                )
                await lease.create(fresh)
            else:
                record.renew_time = micro_time()
                await lease.replace(record)
        finally:
            await lease.close()

    asyncio.run(go())


def controllers(c: Cluster) -> None:
    """The StatefulSet controller (pods deleted once their StatefulSet is gone) and the
    kubelet (a terminating pod gone once its server wrote what it writes on the way)."""
    terminating = [
        p for p in PODS if (c.get("Pod", NS, p) or {}).get("metadata", {}).get("deletionTimestamp")
    ]
    a_server_writes(c)
    for name in terminating:
        c.patch("Pod", NS, name, {"metadata": {"finalizers": None}}).raise_for_status()
    if c.get("StatefulSet", NS, "events") is None:
        for name in PODS:
            if c.get("Pod", NS, name) is not None:
                c.delete("Pod", NS, name).raise_for_status()


def test_a_terminating_server_leaves_no_lease_behind(kube: Cluster):
    ac = client.ApiClient(client.Configuration(host=kube.url))
    spec = {"replicas": 3, "storage": {"pvcRetention": "Delete"}}
    made = durable_stream("events", spec)
    made["metadata"]["finalizers"] = [FINALIZER]  # kopf adds it for the delete handler
    kube.create(made).raise_for_status()
    reconcile.converge(ac, "events", NS, logging.getLogger("test"), Periodic(lambda *_: None))
    for name in PODS:
        kube.create(pod(name)).raise_for_status()
    kube.create(replica_lease("events", NS, "events-0", 3, ["events-1"])).raise_for_status()
    sts = kube.get("StatefulSet", NS, "events")
    assert sts is not None
    rev = f"events-{sts['metadata']['generation']}"
    status = statefulset_status(sts, 3, 3, 3, rev, rev)
    kube.patch("StatefulSet", NS, "events", {"status": status}, status=True).raise_for_status()
    status_round.refresh(ac, "events", NS, Periodic(lambda *_: None))
    lease = kube.get("Lease", NS, "events-leader")
    assert lease is not None and lease["metadata"].get("ownerReferences")  # adopted

    kube.delete(KIND, NS, "events").raise_for_status()
    log = logging.getLogger("test")
    for _attempt in range(20):  # kopf calls the handler again after a TemporaryError
        try:
            handlers.cleanup(name="events", namespace=NS, logger=log)
            break
        except kopf.TemporaryError:
            controllers(kube)
    else:
        pytest.fail("the delete handler never finished")
    kube.patch(KIND, NS, "events", {"metadata": {"finalizers": None}}).raise_for_status()
    assert kube.get(KIND, NS, "events") is None
    for _round in range(3):  # whatever still runs goes on until its pod is gone
        controllers(kube)
    assert [p for p in PODS if kube.get("Pod", NS, p) is not None] == []

    assert kube.get("Lease", NS, "events-leader") is None
    assert kube.get("StatefulSet", NS, "events") is None
