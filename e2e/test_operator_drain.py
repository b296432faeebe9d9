"""Issue 25 end to end: node drains through the PodDisruptionBudget under writers.

A DurableStream under the real operator (kopf against the emulated API server, pods as
real server processes run by the kubelet stand-in), idempotent writers appending through
the client Service (testkit.service_writers), and every node drained in turn as
``kubectl drain`` does it (testkit.drain): each pod evicted through the Eviction API,
retried while the budget answers 429, the primary's node first, so that the primary is
evicted (it hands its Lease over on SIGTERM) and the primary after it too.

The old budget (``minAvailable`` = the in-sync count: 2 of 2 with two replicas) refused
every eviction of a two-replica set for ever; ``kubectl drain`` would retry until its
timeout. Here the drain has a timeout (the liveness bound) and fails naming the budget's
refusal, so the two-replica case fails on the old budget instead of hanging.

The drain must complete, the history checker must find every acknowledged append exactly
once and in order, and every replica must hold byte-identical streams at the end. The
drain's duration, the 429s each node took and the longest pause a writer saw are
printed, never asserted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stream_operator import KIND
from stream_operator.controllers import replica_set
from stream_operator.specs.render import lease_name
from testkit import summary
from testkit.cluster import Cluster
from testkit.drain import Drained, drain_pod
from testkit.history import History, check
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet, Pod
from testkit.operator import operated_api_server
from testkit.service_writers import LIVENESS, Writers, converged, create_streams, until
from testkit.services import ServiceEndpoints

pytestmark = pytest.mark.processes

NS = "default"
NAME = "drained"
STREAMS = ["orders/0", "orders/1"]
WRITERS = {"p0": STREAMS[0], "p1": STREAMS[0], "p2": STREAMS[1]}


def spec(replicas: int, durability: str) -> dict[str, Any]:
    """Short leases, as e2e/test_operator_replica_set.py has them (a failover in seconds,
    three renewal rounds before the deadline on a loaded machine)."""
    return {
        "replicas": replicas,
        "image": "durable-streams-server:0.1.0",
        "replication": {
            "durability": durability,
            "leaseDurationSeconds": 6,
            "renewDeadlineSeconds": 4,
            "retryPeriodSeconds": 1,
        },
        "server": {"logFormat": "plain", "longPollTimeoutSeconds": 2},
        "lifecycle": {"terminationGracePeriodSeconds": 10, "readinessPeriodSeconds": 1},
        # Plain HTTP: the kubelet stand-in reaches pods at 127.0.0.1, which the built-in
        # CA's certificate does not name (TLS over it: tests/replication/test_builtin_ca_set.py).
        "certificates": {"builtIn": False},
    }


def ds_status(kube: Cluster) -> dict[str, Any]:
    return (kube.get(KIND, NS, NAME) or {}).get("status") or {}


def settled(kube: Cluster, replicas: int) -> dict[str, Any] | None:
    """The status once the set is Ready with a primary and every replica in sync."""
    st = ds_status(kube)
    if st.get("phase") == "Ready" and st.get("primary") and st.get("inSyncReplicas") == replicas:
        return st
    return None


def condition(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Cluster]:
    with operated_api_server(tmp_path) as c:
        yield c


@pytest.mark.parametrize(
    ("replicas", "durability"),
    [(3, "required"), (2, "preferred")],
    ids=["3-replicas-required", "2-replicas-preferred"],
)
def test_a_node_drain_evicts_every_pod_in_turn_and_loses_nothing(
    kube: Cluster, tmp_path: Path, replicas: int, durability: str
) -> None:
    evicted_as: list[tuple[int, str]] = []  # (ordinal, the Lease holder when it stopped)

    def note_holder(pod: Pod) -> None:
        lease = kube.get("Lease", NS, lease_name(NAME)) or {}
        evicted_as.append((pod.ordinal, (lease.get("spec") or {}).get("holderIdentity") or ""))

    history = History()
    with Kubelet(kube, NS, NAME, tmp_path, before_stop=note_holder) as kubelet:
        replica_set.use_pod_urls(kubelet.pod_url)
        service = ServiceEndpoints(kube, NS, NAME, kubelet.url_of)
        writers = Writers(service, history, WRITERS)
        try:
            kube.create(durable_stream(NAME, spec(replicas, durability))).raise_for_status()
            first = until(lambda: settled(kube, replicas), lambda: f"ready: {ds_status(kube)}")
            create_streams(service, STREAMS)
            writers.start()
            until(lambda: writers.acked_after(0), "first appends acknowledged")

            # The primary's node first, then the others in order: the pod that became
            # primary when the first handed over is evicted as primary too.
            primary = int(first["primary"].rsplit("-", 1)[1])
            order = [primary, *(o for o in range(replicas) if o != primary)]
            began = time.monotonic()
            drained: list[Drained] = [
                drain_pod(kube, NS, f"{NAME}-{o}", timeout=LIVENESS) for o in order
            ]
            drained_at = time.monotonic()
            last = until(lambda: settled(kube, replicas), lambda: f"settled: {ds_status(kube)}")
            pause = writers.resumed(began, "the drain")
        finally:
            writers.stop.set()
            history.dump(tmp_path / "history.jsonl")
        writers.finish()
        final = converged(kubelet, STREAMS, replicas)

    assert condition(last, "Drainable").get("status") == "True", last
    report = check(history, final)
    print(f"\nhistory: {report.summary()}")
    assert report.ok, f"{report.summary()} (history in {tmp_path / 'history.jsonl'})"
    assert report.acknowledged > 0
    # Every pod was evicted once, the first while it held the Lease.
    assert sorted(o for o, _ in evicted_as) == list(range(replicas)), evicted_as
    assert evicted_as[0] == (primary, f"{NAME}-{primary}"), evicted_as
    primaries = [f"{NAME}-{o}" for o, holder in evicted_as if holder == f"{NAME}-{o}"]
    steps = ", ".join(f"{d.pod} {d.seconds:.1f} s ({d.refusals} x 429)" for d in drained)
    figures = (
        f"drain of {replicas} nodes ({durability}): {drained_at - began:.1f} s [{steps}]; "
        f"evicted as primary: {primaries}; primary at the end {last['primary']} "
        f"(term {last['term']}); longest pause a writer saw: {pause:.2f} s; "
        f"lease {spec(replicas, durability)['replication']['leaseDurationSeconds']} s; "
        f"{report.summary()}"
    )
    print(figures)
    summary.report("operator day two (issue 25)", figures)
