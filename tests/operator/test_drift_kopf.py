"""Issue 42, part 3: no endless drift repair against an API server that stores canonical
objects and a webhook that injects a sidecar.

The real kopf operator runs against the emulated API server (testkit.kube) with what a
real cluster does to the objects it is sent: quantities canonical (``1024Mi`` read back as
``1Gi``), defaults filled in, a service-mesh injector's container, volume, label and
annotation added to the StatefulSet's pod template (testkit.mutating_webhook). Before
the fix every resync called that drift: a ``DriftCorrected`` Warning and an apply each
round, forever. Resyncs run every second here (testkit.operator sets
``DS_OPERATOR_RESYNC_INTERVAL``), and the test counts resyncs the API server saw instead
of waiting for a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.leases import replica_lease
from testkit.mutating_webhook import PROXY, SidecarInjector
from testkit.operator import running_operator
from testkit.pod_objects import claim_volumes, statefulset_status

pytestmark = pytest.mark.processes

NS = "default"
# Quantities no API server stores as written: each comes back in another form.
SPEC: dict[str, Any] = {
    "storage": {"size": "1024Mi"},
    "resources": {
        "requests": {"cpu": "0.5", "memory": "1024Mi"},
        "limits": {"memory": "1.5Gi"},
    },
}
# A write as RBAC sees it; an apply that creates is also asked as a create (not counted twice).
WRITES = ("patch", "update")


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        c.api.webhook = SidecarInjector()
        with running_operator(c):
            yield c


def reconciles(c: Cluster) -> int:
    """The whole reconciles (of any DurableStream) begun so far: each asks whether the
    PodMonitor kind is served, which no status round does."""
    return sum(
        1
        for call in c.api.requests
        if call.verb == "get"
        and (call.resource, call.name)
        == ("customresourcedefinitions", "podmonitors.monitoring.coreos.com")
        and not call.agent.startswith(("python-httpx/", "kopf/"))
    )


def operator_writes(c: Cluster, name: str) -> dict[tuple[str, str], int]:
    """The operator's writes to the DurableStream's StatefulSet and Services, by object."""
    objects = {
        ("statefulsets", name),
        ("services", name),
        ("services", f"{name}-headless"),
        ("services", f"{name}-replicas"),
    }
    out: dict[tuple[str, str], int] = {}
    for call in c.api.requests:
        key = (call.resource, call.name or "")
        if call.verb in WRITES and key in objects and not call.agent.startswith("python-httpx/"):
            out[key] = out.get(key, 0) + 1
    return out


def ready(c: Cluster, name: str, replicas: int) -> None:
    """Create the DurableStream, play the StatefulSet controller, wait for Ready."""
    c.create(durable_stream(name, {**SPEC, "replicas": replicas})).raise_for_status()
    if replicas > 1:
        holder, standbys = f"{name}-0", [f"{name}-{i}" for i in range(1, replicas)]
        c.create(replica_lease(name, NS, holder, 1, standbys)).raise_for_status()
    sts = wait_for(lambda: c.get("StatefulSet", NS, name), message="StatefulSet")
    claim_volumes(c, sts)
    revision = f"{name}-{sts['metadata']['generation']}"
    status = statefulset_status(sts, replicas, replicas, replicas, revision, revision)
    c.patch("StatefulSet", NS, name, {"status": status}, status=True).raise_for_status()

    def phase() -> str | None:
        return ((c.get(KIND, NS, name) or {}).get("status") or {}).get("phase")

    wait_for(lambda: phase() == "Ready", message="Ready")


def resyncs(c: Cluster, count: int) -> None:
    """Wait for ``count`` more whole reconciles (a second apart at best; a loaded
    machine makes each round take longer, hence the generous deadline)."""
    before = reconciles(c)
    wait_for(
        lambda: reconciles(c) >= before + count,
        timeout=30.0 * count,
        message=f"{count} resyncs",
    )


def drift_events(c: Cluster, name: str) -> list[str]:
    return [e["message"] for e in c.events(NS, name, "DriftCorrected")]


@pytest.mark.parametrize("replicas", [1, 3])
def test_what_the_server_and_the_injector_did_is_left_alone(kube: Cluster, replicas: int):
    ready(kube, "events", replicas)
    template = kube.get("StatefulSet", NS, "events")["spec"]["template"]
    # The cluster did change what the operator sent ...
    assert [c["name"] for c in template["spec"]["containers"]] == ["server", PROXY]
    assert template["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"
    resyncs(kube, 1)  # one round after Ready: what converging took is done
    written = operator_writes(kube, "events")
    assert written[("statefulsets", "events")] >= 1
    resyncs(kube, 3)
    # ... and resync after resync, none of it is drift: nothing written, nothing said.
    assert operator_writes(kube, "events") == written
    assert drift_events(kube, "events") == []
    assert written == {key: 1 for key in written}  # each object applied once, when made


def test_a_hand_edit_of_a_rendered_field_is_still_corrected(kube: Cluster):
    ready(kube, "events", 1)
    server = kube.get("StatefulSet", NS, "events")["spec"]["template"]["spec"]["containers"][0]
    image = server["image"]
    variable = next(e for e in server["env"] if "value" in e)
    # kubectl edit's strategic merge patch: containers and env merge by name, the sidecar stays.
    edit = {"name": "server", "image": "evil:1", "env": [{**variable, "value": "edited"}]}
    body = {"spec": {"template": {"spec": {"containers": [edit]}}}}
    kube.patch("StatefulSet", NS, "events", body, strategic=True).raise_for_status()

    def server_now() -> dict[str, Any]:
        containers = kube.get("StatefulSet", NS, "events")["spec"]["template"]["spec"]
        return next(c for c in containers["containers"] if c["name"] == "server")

    wait_for(lambda: server_now()["image"] == image, message="the image put back")
    assert next(e for e in server_now()["env"] if e["name"] == variable["name"]) == variable
    (message,) = kube.wait_for_event(NS, "events", "DriftCorrected", containing="image")
    assert f"env[name={variable['name']}].value" in message["message"]
    # Put back once; then quiet again.
    written = operator_writes(kube, "events")
    resyncs(kube, 3)
    assert operator_writes(kube, "events") == written
    assert len(drift_events(kube, "events")) == 1
