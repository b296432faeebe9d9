"""Issue 16: a replica set's rolling update, decided step by step (rollout.py, pure).

Standbys first (not-ready ones, then the highest ordinal), each back ready and
in sync before the next; then a switchover to an updated in-sync standby; the
old primary last, never while it holds the Lease.
"""

from __future__ import annotations

import json
from typing import Any

from stream_operator.decisions.replica_roles import lease_view
from stream_operator.decisions.rollout import (
    REVISION_LABEL,
    STABLE,
    STARTING_SET,
    SUPERVISED,
    SWITCHING_OVER,
    SWITCHOVER_FAILED,
    UPDATING_FORMER_PRIMARY,
    UPDATING_STANDBYS,
    WAITING_FOR_SWITCHOVER,
    Step,
    failed_switchover,
    plan_rollout,
    requested_switchover,
)

NEW = "ev-new"


def pod(i: int, revision: str | None = "ev-old", *, ready: bool = True, deleting: bool = False):
    meta: dict[str, Any] = {"name": f"ev-{i}", "labels": {}}
    if revision is not None:
        meta["labels"][REVISION_LABEL] = revision
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "status": status}


def lease(holder: str, in_sync: list[str], positions: dict[str, list[int]] | None = None):
    notes = {"streams.pyds.dev/term": "3", "streams.pyds.dev/in-sync": json.dumps(in_sync)}
    if positions:
        notes["streams.pyds.dev/positions"] = json.dumps(positions)
    return lease_view({"metadata": {"annotations": notes}, "spec": {"holderIdentity": holder}})


def plan(pods: list[dict], view, previous: str | None = None, revision: str | None = NEW) -> Step:
    return plan_rollout("ev", 3, revision, pods, view, previous)


ALL_SYNCED = lease("ev-1", ["ev-0", "ev-2"])


def test_nothing_to_do_when_every_pod_runs_the_update_revision():
    assert plan([pod(0, NEW), pod(1, NEW), pod(2, NEW)], ALL_SYNCED) == Step()
    assert plan([pod(0), pod(1), pod(2)], ALL_SYNCED, revision=None) == Step()
    # Pods without the controller's revision label are not judged (never deleted).
    assert plan([pod(0, None), pod(1, None), pod(2, None)], ALL_SYNCED).reason == STABLE


def test_standbys_go_first_highest_ordinal_first_and_never_the_primary():
    """The primary is ev-1, in the middle: a partition could not hold it back."""
    step = plan([pod(0), pod(1), pod(2)], ALL_SYNCED)
    assert (step.reason, step.delete, step.switchover) == (UPDATING_STANDBYS, "ev-2", None)
    # ev-2 recreated on the new revision, ready but not yet back in sync: wait.
    waiting = plan([pod(0), pod(1), pod(2, NEW)], lease("ev-1", ["ev-0"]))
    assert (waiting.delete, waiting.switchover) == (None, None)
    assert waiting.message == "waiting for ev-2 to be ready and in sync"
    # Back in sync: the next standby.
    step = plan([pod(0), pod(1), pod(2, NEW)], ALL_SYNCED)
    assert (step.reason, step.delete) == (UPDATING_STANDBYS, "ev-0")


def test_a_missing_or_terminating_pod_is_waited_for():
    step = plan([pod(0), pod(1)], ALL_SYNCED)
    assert step.delete is None and step.message == "waiting for pod ev-2 to be recreated"
    step = plan([pod(0), pod(1), pod(2, deleting=True)], ALL_SYNCED)
    assert step.delete is None and "ev-2" in step.message


def test_a_not_ready_stale_standby_is_replaced_first_but_blocks_nothing_else():
    step = plan([pod(0, ready=False), pod(1), pod(2)], lease("ev-1", ["ev-2"]))
    assert step.delete == "ev-0"
    # A ready stale standby waits while another pod is not ready.
    step = plan([pod(0, NEW, ready=False), pod(1), pod(2)], lease("ev-1", ["ev-2"]))
    assert step.delete is None and step.message == "waiting for ev-0 to be ready and in sync"


def test_no_step_without_a_ready_primary():
    step = plan([pod(0), pod(1, ready=False), pod(2)], ALL_SYNCED)
    assert step.delete is None and step.switchover is None
    assert "ready primary" in step.message
    assert plan([pod(0), pod(1), pod(2)], lease("", [])).delete is None


def test_then_a_switchover_to_the_updated_standby_furthest_ahead():
    view = lease("ev-1", ["ev-0", "ev-2"], {"ev-0": [3, 90], "ev-2": [3, 120], "ev-1": [3, 120]})
    step = plan([pod(0, NEW), pod(1), pod(2, NEW)], view)
    assert step.reason == SWITCHING_OVER and step.delete is None
    assert step.switchover == ("ev-1", "ev-2")
    # Equal positions: the lowest ordinal, so that the choice is the same every round.
    assert plan([pod(0, NEW), pod(1), pod(2, NEW)], ALL_SYNCED).switchover == ("ev-1", "ev-0")


def test_the_primary_is_never_deleted_while_it_holds_the_lease():
    """Whatever the standbys' state, a stale primary only ever gets a switchover."""
    for in_sync in ([], ["ev-0"], ["ev-0", "ev-2"]):
        for ready in (True, False):
            pods = [pod(0, NEW), pod(1), pod(2, NEW, ready=ready)]
            assert plan(pods, lease("ev-1", in_sync)).delete != "ev-1"
    # No updated standby in sync: the switchover waits, saying so.
    step = plan([pod(0, NEW), pod(1), pod(2, NEW)], lease("ev-1", []))
    assert step.switchover is None and step.delete is None
    assert step.message == "waiting for ev-0 to be ready and in sync"


def test_after_the_switchover_the_former_primary_is_updated_last():
    after = lease("ev-0", ["ev-1", "ev-2"])
    step = plan([pod(0, NEW), pod(1), pod(2, NEW)], after, previous=SWITCHING_OVER)
    assert (step.reason, step.delete) == (UPDATING_FORMER_PRIMARY, "ev-1")
    # The same pods without a switchover behind them: an ordinary standby.
    assert plan([pod(0, NEW), pod(1), pod(2, NEW)], after).reason == UPDATING_STANDBYS
    # And once it is back: stable.
    done = plan([pod(0, NEW), pod(1, NEW), pod(2, NEW)], after, UPDATING_FORMER_PRIMARY)
    assert done == Step()


def test_supervised_updates_the_standbys_then_waits_for_the_users_switchover():
    """Issue 25: primaryUpdateStrategy supervised (CloudNativePG's): the standbys as
    ever, then no switchover of the operator's own, a message saying how to make one;
    after the user's switchover, the former primary is updated."""

    def supervised(pods: list[dict], view, previous: str | None = None) -> Step:
        return plan_rollout("ev", 3, NEW, pods, view, previous, SUPERVISED)

    step = supervised([pod(0), pod(1), pod(2)], ALL_SYNCED)
    assert (step.reason, step.delete) == (UPDATING_STANDBYS, "ev-2")
    view = lease("ev-1", ["ev-0", "ev-2"], {"ev-0": [3, 90], "ev-2": [3, 120]})
    waiting = supervised([pod(0, NEW), pod(1), pod(2, NEW)], view)
    assert waiting.reason == WAITING_FOR_SWITCHOVER
    assert (waiting.delete, waiting.switchover) == (None, None)
    # The way on, with the standby furthest ahead as the suggested target.
    assert waiting.message.endswith(
        "kubectl annotate dstream ev streams.pyds.dev/switchover-to=ev-2"
    )
    # It waits as long as the user does.
    again = supervised([pod(0, NEW), pod(1), pod(2, NEW)], view, WAITING_FOR_SWITCHOVER)
    assert again == waiting
    # The user switched over to ev-0: the former primary ev-1 goes now.
    after = lease("ev-0", ["ev-1", "ev-2"])
    step = supervised([pod(0, NEW), pod(1), pod(2, NEW)], after, WAITING_FOR_SWITCHOVER)
    assert (step.reason, step.delete) == (UPDATING_FORMER_PRIMARY, "ev-1")
    # Unsupervised, the same pods get the operator's own switchover (today's behaviour).
    assert plan([pod(0, NEW), pod(1), pod(2, NEW)], view).switchover == ("ev-1", "ev-2")


def test_a_failed_switchover_says_why_and_is_tried_again():
    step = plan([pod(0, NEW), pod(1), pod(2, NEW)], ALL_SYNCED)
    failed = failed_switchover(step, "503 Service Unavailable: target did not catch up")
    assert failed.reason == SWITCHOVER_FAILED and failed.switchover is None
    assert "503" in failed.message and "ev-1 -> ev-0" in failed.message
    # Next round, from that reason: the same switchover again, not a deletion.
    again = plan([pod(0, NEW), pod(1), pod(2, NEW)], ALL_SYNCED, previous=SWITCHOVER_FAILED)
    assert again.switchover == ("ev-1", "ev-0") and again.delete is None


def test_a_requested_switchover_goes_only_to_an_in_sync_replica_of_the_set():
    view = lease("ev-1", ["ev-2"])  # ev-0 lags
    step = requested_switchover("ev", 3, "ev-2", view)
    assert isinstance(step, Step)
    assert (step.reason, step.switchover) == (SWITCHING_OVER, ("ev-1", "ev-2"))
    assert (
        requested_switchover("ev", 3, "ev-0", view) == "ev-0 is not in sync (in sync: ev-1, ev-2)"
    )
    assert requested_switchover("ev", 3, "ev-1", view) == "ev-1 is the primary already"
    assert "not a replica of ev" in str(requested_switchover("ev", 3, "ev-3", view))
    assert "not a replica of ev" in str(requested_switchover("ev", 3, "other-0", view))
    assert requested_switchover("ev", 3, "ev-2", lease("", [])) == "no replica holds the Lease yet"


def single_node(i: int, revision: str = "ev-old", **kw: Any) -> dict[str, Any]:
    """A pod made from a ``replicas: 1`` template: its server has no replica identity."""
    return {**pod(i, revision, **kw), "spec": {"containers": [{"name": "server", "env": []}]}}


def replica(i: int, revision: str = NEW, **kw: Any) -> dict[str, Any]:
    env = [{"name": "POD_NAME"}, {"name": "DS_REPLICA_NAME", "value": "$(POD_NAME)"}]
    return {**pod(i, revision, **kw), "spec": {"containers": [{"name": "server", "env": env}]}}


def test_a_single_server_scaled_up_is_replaced_first_so_that_it_starts_the_set() -> None:
    """Issue 25: 1 -> 3. Pod 0 still runs single-node (no Lease: no primary to roll
    around, and the new, empty pods wait for pod 0's Lease): it is replaced at once,
    whatever the others do; the rolling update would otherwise wait for ever."""
    new_pods = [replica(1, ready=False), replica(2, ready=False)]
    step = plan([single_node(0), *new_pods], lease_view(None))
    assert (step.reason, step.delete) == (STARTING_SET, "ev-0")
    assert "single-node" in step.message
    # Being replaced: waited for, not deleted twice.
    step = plan([single_node(0, deleting=True), *new_pods], lease_view(None))
    assert (step.reason, step.delete) == (STARTING_SET, None)
    # On the new revision it is a replica: nothing more to do.
    assert plan([replica(0), *new_pods], lease_view(None)) == Step()
    # A stale replica of a set without a Lease is not touched (the old rule: no primary).
    assert plan([replica(0, "ev-old"), *new_pods], lease_view(None)).delete is None
