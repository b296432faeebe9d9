"""Issue 16: the operator's switchover call, over real HTTP, against each answer the
server-operator contract names (a primary played by ``primary_stand_in``, the Lease in
the emulated API server)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from primary_stand_in import StandIn, primary_stand_in

from stream_operator import KIND
from stream_operator.kube.switchover_call import new_token, request_switchover
from stream_operator.specs.render import render_replication_secret
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.leases import replica_lease

NS = "default"
TOKEN = new_token()


@pytest.fixture
def primary() -> Iterator[tuple[Cluster, StandIn]]:
    with cluster() as c:
        # The Secret's owner exists: one with a dangling owner is garbage-collected.
        c.create(durable_stream("events", {"replicas": 3})).raise_for_status()
        uid = c.get(KIND, NS, "events")["metadata"]["uid"]
        secret = render_replication_secret("events", NS, uid, TOKEN)
        c.http.post(f"/api/v1/namespaces/{NS}/secrets", json=secret).raise_for_status()
        c.create(replica_lease("events", NS, "events-0", 4, ["events-2"])).raise_for_status()
        with primary_stand_in(c.url, NS, "events") as stand_in:
            yield c, stand_in


def holder(c: Cluster) -> tuple[str, str]:
    lease = c.get("Lease", NS, "events-leader")
    return lease["spec"]["holderIdentity"], lease["metadata"]["annotations"][
        "streams.pyds.dev/term"
    ]


def call(stand_in: StandIn, pod: str, target: str, token: str = TOKEN):
    return request_switchover(stand_in.url("events", NS, pod, {}), token, target, timeout=2)


def test_a_switchover_moves_the_lease_and_says_to_whom(primary):
    c, stand_in = primary
    answer = call(stand_in, "events-0", "events-2")
    assert answer.ok and (answer.primary, answer.term) == ("events-2", 5)
    assert holder(c) == ("events-2", "5")


def test_refusals_change_nothing_and_say_why(primary):
    c, stand_in = primary
    wrong = call(stand_in, "events-0", "events-2", token="not-it")
    assert not wrong.ok and wrong.why.startswith("401 UNAUTHORIZED")
    lagging = call(stand_in, "events-0", "events-1")
    assert not lagging.ok and lagging.why.startswith("409 NOT_IN_SYNC")
    not_primary = call(stand_in, "events-1", "events-2")
    assert not not_primary.ok and "NOT_PRIMARY" in not_primary.why
    stand_in.fail_next(503, "CATCHUP_TIMEOUT")
    busy = call(stand_in, "events-0", "events-2")
    assert (
        not busy.ok and busy.why.startswith("503 CATCHUP_TIMEOUT") and "Retry-After 1" in busy.why
    )
    assert holder(c) == ("events-0", "4")


def test_no_answer_is_a_failure_not_an_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    answer = request_switchover(f"http://127.0.0.1:{port}", TOKEN, "events-2", timeout=1)
    assert not answer.ok and answer.why.startswith(f"no answer from http://127.0.0.1:{port}")
