"""The Lease holder marks the set's pods itself (issue 25): what it decides to write, and
the writes against the emulated API server with a role loop on a clock the test moves.

Before, only the operator's status round moved the role label, and no pod had an in-sync
condition at all: a failover reached clients only when the operator got to it.
"""

from __future__ import annotations

from typing import Any

from stream_operator.specs.render import lease_name, render_role, render_role_binding
from stream_server.replication.lease.kube_lease import LeaseRecord
from stream_server.replication.lease.pod_labels import (
    IN_SYNC_GATE,
    ROLE,
    PodClient,
    PodMarker,
    PodMarks,
    set_members,
    wanted_marks,
)
from stream_server.replication.lease.roles import RoleLoop
from testkit import rbac
from testkit.cluster import Cluster
from tests.replication.role_loops import Clock, replica

NS = "default"


# -- the decisions --------------------------------------------------------------------------


def test_a_primary_demotes_every_other_pod_before_it_labels_itself() -> None:
    marks = wanted_marks("ds-1", "primary", ["ds-2"], ["ds-0", "ds-1", "ds-2"])
    assert marks == [
        PodMarks("ds-0", "standby", False),
        PodMarks("ds-2", "standby", True),
        PodMarks("ds-1", "primary", True),
    ]


def test_a_standby_labels_only_itself_and_sets_no_condition() -> None:
    assert wanted_marks("ds-1", "standby", ["ds-1"], ["ds-0", "ds-1"]) == [
        PodMarks("ds-1", "standby", None)
    ]


def test_the_members_are_the_ordinals_and_whoever_the_lease_names() -> None:
    assert set_members("ds-1", 3, None) == ["ds-0", "ds-1", "ds-2"]
    # Scaled up while this replica's settings said 3: the Lease names ds-3 and ds-4.
    record = LeaseRecord(holder="ds-0", in_sync=["ds-3"], positions={"ds-4": (1, 2)})
    assert set_members("ds-1", 3, record) == ["ds-0", "ds-1", "ds-2", "ds-3", "ds-4"]
    # A name without an ordinal: the Lease's names only.
    assert set_members("solo", 3, LeaseRecord(holder="other")) == ["other", "solo"]


# -- the writes -----------------------------------------------------------------------------


def make_pods(api: Cluster, prefix: str, count: int) -> None:
    for i in range(count):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{prefix}-{i}", "namespace": NS, "labels": {"app": prefix}},
            "spec": {"containers": [{"name": "server", "image": "i"}]},
        }
        api.create(pod).raise_for_status()
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        api.patch("Pod", NS, f"{prefix}-{i}", {"status": ready}, status=True).raise_for_status()


def marks(api: Cluster, pod: str) -> tuple[str | None, str | None]:
    """(role label, in-sync condition status) of ``pod``."""
    obj: dict[str, Any] = api.get("Pod", NS, pod) or {}
    role = (obj["metadata"].get("labels") or {}).get(ROLE)
    conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
    assert conds.get("Ready") == "True", "the kubelet's condition must stay"
    return role, conds.get(IN_SYNC_GATE)


def marker(api: Cluster, loop: RoleLoop, pod: str, size: int) -> PodMarker:
    return PodMarker(PodClient(NS, api.url), loop, pod, size, every=15.0)


async def test_the_holder_labels_itself_primary_and_sets_in_sync_from_the_lease(
    api: Cluster, lease: str
) -> None:
    prefix = "hold"
    make_pods(api, prefix, 3)
    api.patch("Pod", NS, f"{prefix}-2", {"metadata": {"labels": {ROLE: "primary"}}})
    clock = Clock()
    a = replica(api, lease, f"{prefix}-0", clock)
    b = replica(api, lease, f"{prefix}-1", clock)
    pa, pb = marker(api, a, f"{prefix}-0", 3), marker(api, b, f"{prefix}-1", 3)
    try:
        await a.step()  # creates the Lease: primary for term 1
        await b.step()
        assert await pa.mark()
        # The stale primary label (a previous holder's) went, before ours was written.
        assert marks(api, f"{prefix}-0") == ("primary", "True")
        assert marks(api, f"{prefix}-1") == ("standby", "False")
        assert marks(api, f"{prefix}-2") == ("standby", "False")

        assert await a.change_in_sync([f"{prefix}-1"])
        assert await pa.mark()
        assert marks(api, f"{prefix}-1") == ("standby", "True")
        assert await a.change_in_sync([])  # fell behind: out of the set, not Ready
        assert await pa.mark()
        assert marks(api, f"{prefix}-1") == ("standby", "False")

        # A standby writes its own label only, never a condition.
        api.patch("Pod", NS, f"{prefix}-1", {"metadata": {"labels": {ROLE: "primary"}}})
        assert await pb.mark()
        assert marks(api, f"{prefix}-1") == ("standby", "False")
        assert marks(api, f"{prefix}-0") == ("primary", "True")
    finally:
        await pa.stop()
        await pb.stop()
        await a.stop()
        await b.stop()


async def test_a_primary_past_its_renew_deadline_marks_itself_standby_only(
    api: Cluster, lease: str
) -> None:
    prefix = "late"
    make_pods(api, prefix, 2)
    clock = Clock()
    a = replica(api, lease, f"{prefix}-0", clock)
    pa = marker(api, a, f"{prefix}-0", 2)
    try:
        await a.step()
        assert await a.change_in_sync([f"{prefix}-1"])
        assert await pa.mark()
        assert marks(api, f"{prefix}-1") == ("standby", "True")
        clock.now += a.config.renew_deadline  # no renewal: it may no longer acknowledge
        assert await pa.mark()
        # Its own label follows; the others' marks are no longer its to write.
        assert marks(api, f"{prefix}-0") == ("standby", "True")
        assert marks(api, f"{prefix}-1") == ("standby", "True")
    finally:
        await pa.stop()
        await a.stop()


async def test_missing_pods_are_skipped_and_a_failed_write_is_retried(
    api: Cluster, lease: str
) -> None:
    prefix = "gone"
    make_pods(api, prefix, 1)  # gone-1 and gone-2 do not exist
    clock = Clock()
    a = replica(api, lease, f"{prefix}-0", clock)
    broken = PodMarker(PodClient(NS, "http://127.0.0.1:9"), a, f"{prefix}-0", 3, every=15.0)
    pa = marker(api, a, f"{prefix}-0", 3)
    try:
        await a.step()
        assert not await broken.mark()  # nothing answers: the pass reports it
        assert broken.failures == 1
        assert await pa.mark()
        assert marks(api, f"{prefix}-0") == ("primary", "True")
    finally:
        await broken.stop()
        await pa.stop()
        await a.stop()


async def test_the_pods_role_grants_every_request_a_server_makes_by_name(api: Cluster) -> None:
    """The Role the operator renders for the pods (their Lease and their set's pods, by
    name) allows each request the role loop and the pod marker made, with the object
    named as RBAC's resourceNames match it."""
    name = "rbac"
    lease = f"{NS}/{lease_name(name)}"
    make_pods(api, name, 3)
    before = len(api.api.requests)
    clock = Clock()
    a, b = replica(api, lease, f"{name}-0", clock), replica(api, lease, f"{name}-1", clock)
    pa, pb = marker(api, a, f"{name}-0", 3), marker(api, b, f"{name}-1", 3)
    try:
        await a.step()  # create
        await b.step()
        assert await a.change_in_sync([f"{name}-1"])  # update
        async for _ in a.client.watch():  # the watch, by fieldSelector=metadata.name
            break
        assert await pa.mark()  # get and patch pods, patch pods/status
        assert await pb.mark()
    finally:
        for closing in (pa, pb, a, b):
            await closing.stop()
    calls = [
        c for c in api.api.requests[before:] if c.agent == "durable-streams-server/replication"
    ]
    assert {(c.verb, c.resource) for c in calls} >= {
        ("create", "leases"),
        ("get", "leases"),
        ("update", "leases"),
        ("watch", "leases"),
        ("get", "pods"),
        ("patch", "pods"),
        ("patch", "pods/status"),
    }
    spec = {"replicas": 3}
    docs = [render_role(name, NS, "uid", spec), render_role_binding(name, NS, "uid", spec)]
    granted = rbac.grants(docs, name, NS)
    assert rbac.denied(calls, granted) == []
    # A pod of another set is not the servers' to touch.
    other = calls[-1]._replace(name="other-0")
    assert rbac.denied([other], granted) == [other._replace(agent="")]


class DeposedWhileReading(PodClient):
    """Reads a pod, and by the time the answer is here this replica's renew deadline has
    passed (a new holder may have labelled its own pod meanwhile)."""

    def __init__(self, api: Cluster, clock: Clock, loop: RoleLoop) -> None:
        super().__init__(NS, api.url)
        self.clock, self.loop = clock, loop

    async def get(self, pod: str) -> dict[str, Any] | None:
        got = await super().get(pod)
        self.clock.now += self.loop.config.renew_deadline
        return got


async def test_a_primary_deposed_between_reading_a_pod_and_writing_it_writes_nothing(
    api: Cluster, lease: str
) -> None:
    prefix = "race"
    make_pods(api, prefix, 2)
    # The new holder's label, as the old primary reads it on its way out.
    api.patch("Pod", NS, f"{prefix}-1", {"metadata": {"labels": {ROLE: "primary"}}})
    clock = Clock()
    a = replica(api, lease, f"{prefix}-0", clock)
    pa = PodMarker(DeposedWhileReading(api, clock, a), a, f"{prefix}-0", 2, every=15.0)
    try:
        await a.step()
        assert not await pa.mark()  # gave up: no longer entitled
        assert marks(api, f"{prefix}-1") == ("primary", None)
        assert marks(api, f"{prefix}-0") == (None, None)
    finally:
        await pa.stop()
        await a.stop()
