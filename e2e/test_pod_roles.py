"""Issue 25: a replica set routes by itself. With no operator running, the Lease holder
moves the client Service to itself after a failover, and a standby that falls out of
sync leaves its Services through the in-sync readiness gate, and comes back once in sync.

The real operator renders the set (StatefulSet, Services, Role, Secret) and is then
stopped; the kubelet stand-in (testkit.kubelet) runs the pods as real server processes
against the emulated API server, as a process of its own, and honours readiness gates
as the kubelet does; ``testkit.services.ServiceEndpoints`` routes as the endpoints
controller does (ready pods the selector matches). Before this, only the operator's
status round moved the role label: with it stopped, the client Service kept selecting
the dead primary's pod for ever, and no pod had an in-sync condition at all.

The waits are liveness bounds; the time the Service took to follow is printed, never
asserted.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator.specs.render import lease_name, replicas_name
from testkit import summary, wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.kube_serve import api_server_process
from testkit.kubelet import Kubelet
from testkit.operator import running_operator
from testkit.services import ServiceEndpoints

pytestmark = pytest.mark.processes

NS = "default"
NAME = "routes"
GATE = "streams.pyds.dev/in-sync"
# Short leases, as e2e/test_operator_replica_set.py has them. A readiness probe that
# fails only after 30 s of silence: a paused standby leaves its Services through the gate
# long before its probe would take it out.
SPEC: dict[str, Any] = {
    "replicas": 3,
    "replication": {"leaseDurationSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
    # Plain HTTP: the kubelet stand-in reaches pods at 127.0.0.1, which the built-in CA's
    # certificate does not name (TLS over it: tests/replication/test_builtin_ca_set.py).
    "certificates": {"builtIn": False},
    "server": {"logFormat": "plain", "longPollTimeoutSeconds": 2},
    "lifecycle": {
        "terminationGracePeriodSeconds": 10,
        "readinessPeriodSeconds": 1,
        "readinessFailureThreshold": 30,
    },
}
LIVENESS = 90.0  # seconds any awaited change may take before the test fails (2 shared cores)
# A killed container comes back this much later: the Lease goes to a standby first.
RESTART_DELAY = 30.0


def until(what: Any, message: Any) -> Any:
    return wait_for(what, timeout=LIVENESS, message=message)


def lease(kube: Cluster) -> dict[str, Any]:
    obj = kube.get("Lease", NS, lease_name(NAME)) or {}
    spec, notes = obj.get("spec") or {}, (obj.get("metadata") or {}).get("annotations") or {}
    return {
        "holder": spec.get("holderIdentity") or "",
        "in_sync": notes.get("streams.pyds.dev/in-sync") or "[]",
    }


def conditions(kube: Cluster, pod: str) -> dict[str, dict[str, Any]]:
    status = (kube.get("Pod", NS, pod) or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def status_of(kube: Cluster, pod: str, kind: str) -> str | None:
    return conditions(kube, pod).get(kind, {}).get("status")


def role_of(kube: Cluster, pod: str) -> str | None:
    labels = ((kube.get("Pod", NS, pod) or {}).get("metadata") or {}).get("labels") or {}
    return labels.get("streams.pyds.dev/role")


PODS = [f"{NAME}-{i}" for i in range(3)]


def all_ready(kube: Cluster) -> bool:
    return all(status_of(kube, p, "Ready") == "True" for p in PODS)


def ordinal(pod: str) -> int:
    return int(pod.rsplit("-", 1)[1])


@pytest.fixture
def unattended(tmp_path: Path) -> Iterator[tuple[Cluster, Kubelet]]:
    """A 3-replica set, every pod Ready (in sync), the operator that made it stopped."""
    with (
        api_server_process(tmp_path) as kube,
        Kubelet(kube, NS, NAME, tmp_path, restart_delay=RESTART_DELAY) as kubelet,
    ):
        with running_operator(kube):
            kube.create(durable_stream(NAME, SPEC)).raise_for_status()
            until(lambda: all_ready(kube), lambda: f"every pod Ready: {lease(kube)}")
        yield kube, kubelet


def test_the_client_service_follows_a_failover_with_no_operator(
    unattended: tuple[Cluster, Kubelet],
) -> None:
    kube, kubelet = unattended
    service = ServiceEndpoints(kube, NS, NAME, kubelet.url_of, refresh=0.0)
    old = until(lambda: lease(kube)["holder"], "a primary")
    until(lambda: service.pods() == [old], lambda: f"the Service on {old}: {service.pods()}")

    killed = time.monotonic()
    kubelet.kill(ordinal(old), signal.SIGKILL)  # the container comes back 30 s later

    def followed() -> str | None:
        holder = lease(kube)["holder"]
        return holder if holder and holder != old and service.pods() == [holder] else None

    new = until(
        followed,
        lambda: (
            f"the Service on the new primary {lease(kube)}: {service.pods()}, "
            f"labels {[role_of(kube, p) for p in PODS]}"
        ),
    )
    figures = f"the client Service followed {old} -> {new} in {time.monotonic() - killed:.1f} s"
    print("\n" + figures)
    summary.report("operator day two (issue 25)", f"{figures} after a kill -9, no operator running")
    assert role_of(kube, old) == "standby"  # demoted by the new holder, first
    assert status_of(kube, old, GATE) == "False"

    # Writes go through the Service to the new primary (once a standby is in sync).
    def created() -> bool:
        urls = service.urls()
        if not urls:
            return False
        r = httpx.put(f"{urls[0]}/v1/stream/after", headers={"Content-Type": "text/plain"})
        return r.status_code in (200, 201)

    until(created, "a stream created through the Service after the failover")


def test_a_standby_out_of_sync_is_not_ready_through_the_gate_until_it_catches_up(
    unattended: tuple[Cluster, Kubelet],
) -> None:
    kube, kubelet = unattended
    replicas = ServiceEndpoints(kube, NS, replicas_name(NAME), kubelet.url_of, refresh=0.0)
    primary = until(lambda: lease(kube)["holder"], "a primary")
    standby = next(p for p in PODS if p != primary)
    until(lambda: standby in replicas.pods(), "the standby behind the -replicas Service")

    kubelet.kill(ordinal(standby), signal.SIGSTOP)
    try:
        until(
            lambda: (
                status_of(kube, standby, GATE) == "False"
                and status_of(kube, standby, "Ready") == "False"
            ),
            lambda: f"{standby} not in sync and not Ready: {conditions(kube, standby)}",
        )
        # Its probe has not failed long enough: the gate alone made it not Ready.
        ready = conditions(kube, standby)["Ready"]
        assert ready.get("reason") == "ReadinessGatesNotReady", ready
        assert standby not in replicas.pods()
    finally:
        kubelet.kill(ordinal(standby), signal.SIGCONT)

    until(
        lambda: (
            status_of(kube, standby, GATE) == "True" and status_of(kube, standby, "Ready") == "True"
        ),
        lambda: f"{standby} in sync and Ready again: {conditions(kube, standby)}",
    )
    assert standby in replicas.pods()
    assert lease(kube)["holder"] == primary  # the primary never changed
