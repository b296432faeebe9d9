"""Issue 16: what a replica set's status says between two primaries, during a rolling
update, and which standby the Spark jobs read (pure functions, no cluster)."""

from __future__ import annotations

import datetime
import json
from typing import Any

from stream_operator.decisions.analytics_source import choose_source
from stream_operator.decisions.replica_roles import (
    LEASE_EXPIRED,
    PRIMARY_LOST,
    failing_over,
    lease_view,
)
from stream_operator.decisions.rollout import UPDATING_STANDBYS, Step
from stream_operator.decisions.status import compute_status

NOW = datetime.datetime(2026, 11, 23, 12, 0, 0, tzinfo=datetime.UTC)
THREE = {"replicas": 3}


def lease(holder: str, in_sync: list[str], renewed: str = "2026-11-23T11:59:55.000000Z"):
    notes = {"streams.pyds.dev/term": "2", "streams.pyds.dev/in-sync": json.dumps(in_sync)}
    spec = {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed}
    return {"metadata": {"annotations": notes}, "spec": spec}


def pod(name: str, ready: bool = True) -> dict[str, Any]:
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": {"name": name}, "status": status}


PODS = [pod("ev-0"), pod("ev-1"), pod("ev-2")]


def sts() -> dict[str, Any]:
    st = {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "observedGeneration": 1}
    return {"metadata": {"generation": 1}, "status": st}


def status(lease_obj, pods, previous=None, rollout=None) -> dict[str, Any]:
    return compute_status(
        spec=THREE,
        generation=1,
        statefulset=sts(),
        endpoint="e",
        pods=pods,
        lease=lease_obj,
        previous=previous,
        rollout=rollout,
        now=NOW,
    )


def conds(s: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]}


def test_failing_over_from_a_lost_pod_or_an_expired_lease_until_a_ready_holder():
    view = lease_view(lease("ev-0", ["ev-1"]))
    assert failing_over(view, PODS, had_primary=True, now=NOW) is None
    gone = failing_over(view, PODS[1:], had_primary=True, now=NOW)
    assert gone is not None and gone[0] == PRIMARY_LOST and "ev-0's pod is gone" in gone[1]
    unready = [pod("ev-0", ready=False), *PODS[1:]]
    assert failing_over(view, unready, had_primary=True, now=NOW)[0] == PRIMARY_LOST
    stale = lease_view(lease("ev-0", ["ev-1"], renewed="2026-11-23T11:59:30.000000Z"))
    expired = failing_over(stale, PODS, had_primary=True, now=NOW)
    assert expired is not None and expired[0] == LEASE_EXPIRED
    # A new holder whose pod is not ready yet: still failing over; ready: over.
    moved = lease_view(lease("ev-1", []))
    half = [PODS[0], pod("ev-1", ready=False), PODS[2]]
    assert failing_over(moved, half, had_primary=True, now=NOW) is not None
    assert failing_over(moved, PODS, had_primary=True, now=NOW) is None
    # The first election of a new set is no failover.
    assert failing_over(view, unready, had_primary=False, now=NOW) is None


def test_the_status_says_failing_over_and_not_ready_meanwhile():
    healthy = status(lease("ev-0", ["ev-1", "ev-2"]), PODS)
    assert conds(healthy)["FailingOver"] == ("False", "PrimaryHoldsLease")
    assert healthy["phase"] == "Ready"
    lost = status(lease("ev-0", ["ev-1", "ev-2"]), PODS[1:], previous=healthy)
    assert conds(lost)["FailingOver"] == ("True", PRIMARY_LOST)
    assert conds(lost)["Ready"] == ("False", PRIMARY_LOST) and lost["phase"] == "Degraded"
    over = status(lease("ev-2", ["ev-1"]), [pod("ev-0", False), *PODS[1:]], previous=lost)
    assert conds(over)["FailingOver"][0] == "False" and over["primary"] == "ev-2"


def test_progressing_names_the_rolling_updates_step():
    step = Step(UPDATING_STANDBYS, "updating ev-2 (a standby)", delete="ev-2")
    s = status(lease("ev-0", ["ev-1", "ev-2"]), PODS, rollout=step)
    progressing = next(c for c in s["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", UPDATING_STANDBYS)
    assert progressing["message"] == "updating ev-2 (a standby)"
    assert conds(status(lease("ev-0", ["ev-1"]), PODS, rollout=Step()))["Progressing"][0] == (
        "False"
    )


def test_spark_reads_an_in_sync_standby_and_stays_on_it():
    view = lease_view(lease("ev-0", ["ev-1", "ev-2"]))
    assert choose_source("ev", 3, view, []).replica == 1
    assert choose_source("ev", 3, view, [2]).replica == 2  # sticky
    # Its standby fell out of sync: another in-sync one.
    assert choose_source("ev", 3, lease_view(lease("ev-0", ["ev-1"])), [2]).replica == 1
    # The one it read became the primary: never the primary's volume.
    moved = lease_view(lease("ev-2", ["ev-0"]))
    assert choose_source("ev", 3, moved, [2]).replica == 0


def test_spark_waits_while_no_standby_is_in_sync():
    alone = lease_view(lease("ev-0", []))
    first = choose_source("ev", 3, alone, [])
    assert first.replica is None and "no standby is in sync (ev-0 holds the Lease)" in (
        first.waiting or ""
    )
    held = choose_source("ev", 3, alone, [1])
    assert held.replica == 1 and held.waiting is not None  # kept, suspended
    assert choose_source("ev", 3, lease_view(None), []).waiting is not None


def test_a_crash_looping_primary_keeps_its_own_words_in_ready():
    """FailingOver says the set is between primaries; Ready keeps the pod's reason."""
    looping = {
        "metadata": {"name": "ev-0"},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "server",
                    "ready": False,
                    "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 2, "message": "disk full"}},
                }
            ],
        },
    }
    healthy = status(lease("ev-0", ["ev-1", "ev-2"]), PODS)
    s = compute_status(
        spec=THREE,
        generation=1,
        statefulset={**sts(), "status": {**sts()["status"], "readyReplicas": 2}},
        endpoint="e",
        pods=[looping, *PODS[1:]],
        lease=lease("ev-0", ["ev-1", "ev-2"]),
        previous=healthy,
        now=NOW,
    )
    assert conds(s)["FailingOver"] == ("True", PRIMARY_LOST)
    assert conds(s)["Ready"] == ("False", "CrashLoopBackOff") and s["phase"] == "Degraded"
