"""Issue 25 end to end: scaling a DurableStream under the real operator keeps every
acknowledged byte, on the Service and on every replica.

A ``replicas: 1`` DurableStream gets streams of every kind and a subscription
(``testkit.stream_kinds``: text, JSON, an idempotent producer's stream, a closed stream, a
fork, a pull-wake subscription) through its Service; then it is scaled 1 -> 3, written
to, 3 -> 1, written to, 1 -> 3, written to, and 3 -> 5 (with containers for pods, the
first three steps only). After each step, once the operator reports the set settled,
every acknowledged write must read back through the Service (the primary: where a
retried ``Producer-Seq`` is a duplicate, the closed stream refuses an append, the fork
and the subscription created again are the same) and on every replica's own address
(byte-identical streams, the same JSON messages, still closed, the same subscription).

What the steps need of the operator (docs/kubernetes.md, "Scaling"): at 1 -> 3, pod 0,
which holds the data, restarts as the set's bootstrap replica and leads, and the new,
empty pods copy from it; at 3 -> 1, pod 0 leaves the set, and the operator deletes the
Lease and the removed pods' claims, so that at 1 -> 3 again no stale member leads a set
without what pod 0 acknowledged alone, and the new pods (new, empty volumes: the
kubelet stand-in gives a claim made again a new directory) copy from pod 0 once more.

kopf runs the real handlers against the emulated API server (a process of its own); the
kubelet stand-in (testkit.kubelet) runs the pods as server processes of this checkout,
or as containers of the server image. Each step's duration is printed; the waits are
liveness bounds only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from stream_operator import KIND
from stream_operator.controllers import replica_set
from testkit import images, summary, wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.operator import operated_api_server
from testkit.pod_runtimes import Processes, Runtime
from testkit.services import ServiceEndpoints
from testkit.stream_kinds import StreamKinds

pytestmark = pytest.mark.processes

NS = "default"
NAME = "keep"
# Short leases, so that a set forms in seconds; a renew deadline that leaves a primary
# three rounds to renew on a loaded machine (2 cores shared with other tests).
SPEC: dict[str, Any] = {
    "replicas": 1,
    "image": "durable-streams-server:0.1.0",
    "replication": {"leaseDurationSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
    "server": {"logFormat": "plain", "longPollTimeoutSeconds": 2},
    "lifecycle": {"terminationGracePeriodSeconds": 10, "readinessPeriodSeconds": 1},
}
# 3 -> 5 moves the majority, so every pod restarts (render.config_hash): the same
# rolling restart whatever runs the pods, so the containers take the first three steps
# only, the scale-ups from one replica and the scale-down between them (the suite's time).
STEPS = [(1, 3), (3, 1), (1, 3), (3, 5)]
LIVENESS = 150.0  # seconds any awaited change may take before the test fails (2 shared cores)
T = TypeVar("T")


def until(what: Callable[[], T | None], message: str | Callable[[], str]) -> T:
    return wait_for(what, timeout=LIVENESS, message=message)


def ds(kube: Cluster) -> dict[str, Any]:
    return kube.get(KIND, NS, NAME) or {}


def conditions(kube: Cluster) -> str:
    st = ds(kube).get("status") or {}
    shown = [
        f"{c['type']}={c['status']} {c['reason']}: {c['message']}"
        for c in st.get("conditions") or []
    ]
    return f"phase {st.get('phase')}, primary {st.get('primary')}; " + "; ".join(shown)


def settled(kube: Cluster, kubelet: Kubelet, replicas: int) -> dict[str, Any] | None:
    """The status once the operator reports ``replicas`` servers ready at the newest
    generation and nothing in progress (a scale-down to one restarts pod 0 after the
    others stopped; a set: a primary and every replica in sync), with exactly that many
    pods running and none left on an older revision; None before."""
    obj = ds(kube)
    st = obj.get("status") or {}
    if (
        st.get("phase") != "Ready"
        or st.get("observedGeneration") != obj["metadata"].get("generation")
        or st.get("readyReplicas") != replicas
        or any(c["type"] == "Progressing" and c["status"] == "True" for c in st["conditions"])
    ):
        return None
    if replicas > 1 and (not st.get("primary") or st.get("inSyncReplicas") != replicas):
        return None
    pods = kubelet.ready_pods()
    if sorted(p.ordinal for p in pods) != list(range(replicas)) or len(kubelet.pods) != replicas:
        return None
    sts = kube.get("StatefulSet", NS, NAME) or {}
    revision = (sts.get("status") or {}).get("updateRevision")
    return st if all(p.revision == revision for p in pods) else None


def service_url(service: ServiceEndpoints, kubelet: Kubelet, st: dict[str, Any]) -> str:
    """The one pod the client Service sends a connection to: the primary's, for a set."""

    def one() -> str | None:
        urls = service.urls()
        if len(urls) != 1:
            return None
        if st.get("primary") and urls[0] != kubelet.url_of(st["primary"]):
            return None
        return urls[0]

    return until(one, lambda: f"the Service on one pod ({st.get('primary')}): {service.urls()}")


def everything_kept(
    kinds: StreamKinds, kube: Cluster, kubelet: Kubelet, service: ServiceEndpoints, replicas: int
) -> None:
    """Every acknowledged write, through the Service and on each replica's own address."""
    st = until(lambda: settled(kube, kubelet, replicas), lambda: conditions(kube))
    url = service_url(service, kubelet, st)
    with httpx.Client(timeout=15) as client:
        wrong = kinds.primary_differences(client, url)
        assert not wrong, f"through the Service ({st.get('primary') or NAME}-0): {wrong}"
        for pod in sorted(kubelet.ready_pods(), key=lambda p: p.ordinal):
            # A standby serves up to the commit point the primary announced to it.
            held_on(kinds, client, f"{NAME}-{pod.ordinal}", pod.url)


def held_on(kinds: StreamKinds, client: httpx.Client, pod: str, url: str) -> None:
    """Every acknowledged write read back from one replica's own address."""
    last: list[str] = []

    def same() -> bool:
        last[:] = kinds.differences(client, url)
        return not last

    until(same, lambda: f"{pod} holds everything: {last}")


def write(
    kinds: StreamKinds, kube: Cluster, kubelet: Kubelet, service: ServiceEndpoints, replicas: int
) -> None:
    st = until(lambda: settled(kube, kubelet, replicas), lambda: conditions(kube))
    with httpx.Client(timeout=15) as client:
        kinds.write_round(client, service_url(service, kubelet, st))


def scale(kube: Cluster, replicas: int) -> None:
    kube.patch(KIND, NS, NAME, {"spec": {"replicas": replicas}}).raise_for_status()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Cluster]:
    with operated_api_server(tmp_path) as c:
        yield c


@pytest.fixture(params=images.POD_RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """How the pods run: processes of this checkout, or containers of the server image."""
    with images.pod_runtime(request.param, SPEC["image"]) as runtime:
        yield runtime


def test_scaling_up_down_and_up_again_keeps_every_acknowledged_write(
    kube: Cluster, runtime: Runtime, tmp_path: Path
) -> None:
    kinds = StreamKinds()
    durations: list[str] = []
    with Kubelet(kube, NS, NAME, tmp_path, restart_delay=1.0, runtime=runtime) as kubelet:
        # The operator reaches a pod (to ask for a switchover) where the stand-in runs it.
        replica_set.use_pod_urls(kubelet.pod_url)
        service = ServiceEndpoints(kube, NS, NAME, kubelet.url_of)
        started = time.monotonic()
        kube.create(durable_stream(NAME, SPEC)).raise_for_status()
        write(kinds, kube, kubelet, service, 1)
        everything_kept(kinds, kube, kubelet, service, 1)
        durations.append(f"1 replica ready and written: {time.monotonic() - started:.1f} s")
        steps = STEPS if isinstance(runtime, Processes) else STEPS[:3]
        for i, (before, after) in enumerate(steps):
            began = time.monotonic()
            scale(kube, after)
            everything_kept(kinds, kube, kubelet, service, after)
            durations.append(f"{before} -> {after}: {time.monotonic() - began:.1f} s")
            if i < len(steps) - 1:
                write(kinds, kube, kubelet, service, after)
                everything_kept(kinds, kube, kubelet, service, after)
    figures = "; ".join(durations) + f" ({kinds.rounds} rounds of writes)"
    print("\n" + figures)
    summary.report(
        "operator day two (issue 25)", f"scaling ({type(runtime).__name__.lower()}): {figures}"
    )
