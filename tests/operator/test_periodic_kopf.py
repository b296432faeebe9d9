"""Issue 25: one DurableStream whose periodic round hangs does not hold up another's status,
and ``/healthz`` fails while a round is stuck, under the real kopf operator.

Two replica sets, ``slow`` and ``events``. A switchover asked of ``slow`` (the
``switchover-to`` annotation) goes to a pod URL served by ``Silent(trickle=True)``: a
real TCP server that starts an answer and never ends it, so the operator's call is held
until the test releases it (its read timeout never fires). Meanwhile ``events``' Lease
changes hands, and its status must name the new primary while ``slow``'s call is still
open: before, every object's round ran one after another in one thread, so ``events``
waited until the call gave up.

The call is held by the test, not by a timeout racing the test's waits: on a loaded
machine (the suite on two workers) the operator's rounds and its Events take seconds,
and a window between "stuck" and the call's own 15 s timeout could close before a wait
saw it. Every wait here has a generous deadline for the same reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry
from silent_peer import Silent

from stream_operator import KIND
from stream_operator.controllers import operator_metrics
from stream_operator.decisions.rollout import SWITCHOVER_TO
from testkit import free_port, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.leases import write_replica_lease
from testkit.operator import running_operator
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

pytestmark = pytest.mark.slow

NS = "default"
# Each wait's deadline: far more than an unloaded run needs (a few seconds), for the
# rounds and Events of an operator sharing two cores with the rest of the suite.
PATIENCE = 90.0


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cluster, Silent]]:
    from stream_operator.controllers import replica_set

    # Status refreshes only (a whole reconcile's many requests would slow the rounds), and
    # a round counts as stuck after 4 s (read as the operator starts). An ordinary round
    # on a loaded machine can take longer (it waits for the object's lock while kopf's
    # reconcile of it runs), so /healthz may fail for a moment without a stuck call:
    # the test waits for it to answer, where it once asserted the first answer.
    monkeypatch.setenv("DS_OPERATOR_RESYNC_INTERVAL", "60")
    monkeypatch.setenv("DS_OPERATOR_STALL_SECONDS", "4")
    silent = Silent(trickle=True)
    with cluster() as c:
        replica_set.use_pod_urls(
            lambda name, namespace, pod, spec: silent.url if name == "slow" else "http://unused"
        )
        try:
            with running_operator(c):
                try:
                    yield c, silent
                finally:
                    silent.release()  # lets the hung round end before the operator stops
        finally:
            replica_set.use_pod_urls(None)
            silent.close()


def replica_set_up(c: Cluster, name: str) -> None:
    """A replica set of three, its pods ready (the StatefulSet controller's and kubelet's
    part) and ``<name>-0`` holding its Lease with the others in sync."""
    c.create(durable_stream(name, {"replicas": 3})).raise_for_status()
    sts = wait_for(
        lambda: c.get("StatefulSet", NS, name), timeout=PATIENCE, message=f"{name}'s StatefulSet"
    )
    claim_volumes(c, sts)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    for i in range(3):
        c.create(pod_object(sts, i)).raise_for_status()
        status = pod_status(container, ready=True, restarts=0)
        c.patch("Pod", NS, f"{name}-{i}", {"status": status}, status=True).raise_for_status()
    revision = f"{name}-{sts['metadata']['generation']}"
    status = statefulset_status(sts, 3, 3, 3, revision, revision)
    c.patch("StatefulSet", NS, name, {"status": status}, status=True).raise_for_status()
    write_replica_lease(c, name, NS, f"{name}-0", 1, [f"{name}-1", f"{name}-2"])
    wait_for(
        lambda: primary(c, name) == f"{name}-0",
        timeout=PATIENCE,
        message=f"{name}'s status: {name}-0",
    )


def primary(c: Cluster, name: str) -> str | None:
    return ((c.get(KIND, NS, name) or {}).get("status") or {}).get("primary")


def hang_a_round_of_slow(c: Cluster, silent: Silent) -> None:
    """Ask for a switchover of ``slow``: the operator's call to its primary never returns."""
    body = {"metadata": {"annotations": {SWITCHOVER_TO: "slow-1"}}}
    c.patch(KIND, NS, "slow", body).raise_for_status()
    assert silent.accepted.wait(PATIENCE), "the operator never called slow's primary"


def test_a_hung_round_of_one_object_does_not_hold_up_anothers_status(
    kube: tuple[Cluster, Silent],
):
    c, silent = kube
    replica_set_up(c, "slow")
    replica_set_up(c, "events")
    hang_a_round_of_slow(c, silent)
    # events' primary fails over while slow's switchover call hangs.
    write_replica_lease(c, "events", NS, "events-1", 2, ["events-2"])
    wait_for(
        lambda: primary(c, "events") == "events-1",
        timeout=PATIENCE,
        message="events' status: events-1 (while slow's call is held open)",
    )
    assert not silent.gave_up.is_set(), "the operator gave up slow's call: nothing was shown"
    # The role labels the client Service selects on followed too.
    roles = {
        p["metadata"]["name"]: p["metadata"]["labels"].get("streams.pyds.dev/role")
        for p in c.list("Pod", NS, "app.kubernetes.io/instance=events")
    }
    assert roles == {"events-0": "standby", "events-1": "primary", "events-2": "standby"}


def test_healthz_fails_while_a_round_is_stuck_and_answers_again_after(
    kube: tuple[Cluster, Silent],
):
    from stream_operator.controllers import handlers

    c, silent = kube
    port = free_port()
    server = operator_metrics.serve("127.0.0.1", port, handlers.alive, registry=CollectorRegistry())

    def healthz() -> int:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code

    try:
        replica_set_up(c, "slow")
        wait_for(lambda: healthz() == 200, timeout=PATIENCE, message="/healthz answering")
        hang_a_round_of_slow(c, silent)
        wait_for(
            lambda: healthz() == 503,
            timeout=PATIENCE,
            message="/healthz failing while slow's round hangs",
        )
        silent.release()
        wait_for(lambda: healthz() == 200, timeout=PATIENCE, message="/healthz answering again")
        # The round ended with the call's failure, told in an Event.
        failed = wait_for(
            lambda: [
                e["message"]
                for e in c.list("Event", NS)
                if e["involvedObject"]["name"] == "slow" and e["reason"] == "SwitchoverFailed"
            ],
            timeout=PATIENCE,
            message=lambda: (
                "the failed switchover's Event; the Events: "
                f"{[(e['reason'], e['message']) for e in c.list('Event', NS)]}"
            ),
        )
        assert "no answer from" in failed[0], json.dumps(failed)
    finally:
        server.shutdown()
        server.server_close()
