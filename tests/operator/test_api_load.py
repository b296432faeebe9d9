"""Issue 42: the operator's API load in a steady state does not grow with rounds, and a
status round reads each thing once (testkit.api_load counts the requests of each round;
e2e/api_load_figures.py prints the figures for 100 DurableStreams, docs/kubernetes.md
"API load").

Counts, not timings: a status round of a converged DurableStream lists its claims once
(three lists before ``round_reads``), reads its fence ConfigMap only when the fence list
changed or a resync interval passed (every round before), and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.api_load import Tally, converged, one_round, without_events
from testkit.cluster import Cluster, cluster

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
