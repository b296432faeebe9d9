"""Issue 42: the operator's API load in a steady state does not grow with rounds, and a
status round reads each thing once (testkit.api_load counts the requests of each round;
e2e/api_load_figures.py prints the figures for 100 DurableStreams, docs/kubernetes.md
"API load").

Counts, not timings: a status round of a converged DurableStream lists its claims once
(three lists before ``round_reads``), reads its fence ConfigMap only when the fence list
changed or a resync interval passed (every round before), and writes nothing. With the
watch-fed cache (``kube.object_cache``) synced it reads only its DurableStream (four
requests more before), follows a pod's change and a 410 Gone's relist, and reads the
API as before while the cache cannot answer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from stream_operator.kube import object_cache
from testkit import wait_for
from testkit.api_load import (
    NS,
    Tally,
    converged,
    one_round,
    settle,
    watch_cache,
    without_events,
)
from testkit.cluster import Cluster, cluster
from testkit.pod_objects import pod_status, statefulset_status

pytestmark = pytest.mark.slow  # whole reconciles of several objects: make test-fast skips it

COUNT = 3


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c, without_events():
        yield c


def writes(tally: Tally) -> Tally:
    return Tally({k: n for k, n in tally.items() if k[0] not in ("get", "list", "watch")})


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_steady_state_round_asks_the_same_and_reads_each_thing_once(kube: Cluster, replicas: int):
    names = converged(kube, COUNT, replicas)
    for _ in range(2):  # the first rounds write the status, labels, the Lease's owner
        one_round(kube, names, resync=True)
        one_round(kube, names, resync=False)
    status = [one_round(kube, names, resync=False)[0] for _ in range(3)]
    resync = [one_round(kube, names, resync=True)[0] for _ in range(2)]
    assert status[0] == status[1] == status[2]  # nothing grows with rounds
    assert resync[0] == resync[1]
    assert writes(status[0]) == Tally()  # no churn
    assert status[0][("list", "persistentvolumeclaims")] == COUNT  # once per object
    assert status[0][("get", "configmaps")] == 0  # the fence list, unchanged: not read
    assert status[0][("get", "durablestreams")] == COUNT


# The watch-fed cache (kube.object_cache): once it holds what the API server holds, a
# status round asks only for its DurableStream; before, or when the cache cannot answer,
# it reads the API as above.
WATCHED = (
    ("get", "statefulsets"),
    ("list", "pods"),
    ("list", "persistentvolumeclaims"),
    ("get", "leases"),
)


def status_round(kube: Cluster, names: list[str], cache: object_cache.ObjectCache) -> Tally:
    settle(kube, cache)
    return one_round(kube, names, resync=False)[0]


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_synced_status_round_asks_only_for_its_durablestream(kube: Cluster, replicas: int):
    with watch_cache(kube) as cache:
        names = converged(kube, COUNT, replicas)
        for _ in range(2):
            one_round(kube, names, resync=True)
            one_round(kube, names, resync=False)
        status = status_round(kube, names, cache)
    assert status == Tally({("get", "durablestreams"): COUNT}), status


def crash_looping(kube: Cluster, name: str) -> None:
    """The kubelet reports the server's container waiting in CrashLoopBackOff, and the
    StatefulSet controller its pod not ready."""
    sts = kube.get("StatefulSet", NS, name)
    assert sts is not None
    container = sts["spec"]["template"]["spec"]["containers"][0]
    status = pod_status(container, ready=False, restarts=3, waiting=("CrashLoopBackOff", "boom"))
    kube.patch("Pod", NS, f"{name}-0", {"status": status}, status=True).raise_for_status()
    rev = sts["status"]["currentRevision"]
    sts_status = statefulset_status(sts, 1, 0, 1, rev, rev)
    kube.patch("StatefulSet", NS, name, {"status": sts_status}, status=True).raise_for_status()


def ready_reason(kube: Cluster, name: str) -> str:
    ds = kube.get("DurableStream", NS, name) or {}
    found = [c for c in ds["status"]["conditions"] if c["type"] == "Ready"]
    return str(found[0]["reason"])


def test_the_cache_follows_a_pod_that_stops_being_ready(kube: Cluster):
    with watch_cache(kube) as cache:
        names = converged(kube, 1, 1)
        status_round(kube, names, cache)
        status_round(kube, names, cache)
        assert ready_reason(kube, "s000") != "CrashLoopBackOff"
        crash_looping(kube, "s000")
        tally = status_round(kube, names, cache)
    assert ready_reason(kube, "s000") == "CrashLoopBackOff"
    assert all(tally[request] == 0 for request in WATCHED), tally  # told by the watches


def test_the_cache_lists_again_after_410_gone_and_follows_on(kube: Cluster):
    with watch_cache(kube) as cache:
        names = converged(kube, 1, 1)
        status_round(kube, names, cache)
        pods = cache.watched("Pod", NS)
        assert pods.lists == 1
        kube.api.watches.compact()  # every version so far left the window
        kube.api.watches.end_all()  # the watches resume from one: 410 Gone
        wait_for(lambda: pods.lists == 2, message="the pods were not listed again")
        assert kube.api.watches.expired >= 1
        crash_looping(kube, "s000")
        tally = status_round(kube, names, cache)
    assert ready_reason(kube, "s000") == "CrashLoopBackOff"
    assert all(tally[request] == 0 for request in WATCHED), tally


def test_a_status_round_reads_the_api_while_the_cache_cannot_answer(kube: Cluster):
    """A cache that never listed (here: its API server unreachable; in an operator, the
    first rounds of a namespace) answers nothing: the round reads as it did before."""
    names = converged(kube, 1, 1)
    unreachable = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    cache = object_cache.install(unreachable)
    try:
        one_round(kube, names, resync=False)
        crash_looping(kube, "s000")
        tally = one_round(kube, names, resync=False)[0]
        assert not cache.synced(NS)
    finally:
        object_cache.uninstall()
    assert ready_reason(kube, "s000") == "CrashLoopBackOff"
    assert all(tally[request] == 1 for request in WATCHED), tally


def test_a_round_reads_the_api_while_a_rollout_is_under_way(kube: Cluster):
    """The StatefulSet's pods on two revisions: the round's steps (which pod to delete
    next) are decided from the API server's answers, not the watch's."""
    with watch_cache(kube) as cache:
        names = converged(kube, 1, 1)
        status_round(kube, names, cache)
        sts = kube.get("StatefulSet", NS, "s000")
        assert sts is not None
        rev = sts["status"]["currentRevision"]
        rolling = statefulset_status(sts, 1, 1, 0, rev, f"{rev}-next")
        kube.patch("StatefulSet", NS, "s000", {"status": rolling}, status=True).raise_for_status()
        tally = status_round(kube, names, cache)
    assert tally[("list", "pods")] == 1
    assert tally[("get", "statefulsets")] == 0  # what told the round to read the API
