"""Promotion and demotion as pure decisions (stream_operator.decisions.replica_cluster): what the
pods are rendered as, whether the set is held at 0 pods, whether its claims go, the
ReplicaCluster condition and the Event of each step; and the kubectl plugin's patches."""

from __future__ import annotations

import pytest

from stream_operator.decisions.replica_cluster import (
    DEMOTING,
    DEMOTION_REFUSED,
    FOLLOWER,
    FOLLOWING,
    PROMOTED,
    PROMOTING,
    REBUILD,
    REBUILDING,
    WRITER,
    Seen,
    Wanted,
    decide,
    refused,
    rolled_out,
    step_events,
)
from stream_operator.plugin import PluginError
from stream_operator.plugin.replica import demotion_patch, promotion_patch

FOLLOW = Wanted(enabled=True, source="s3://b/events", own="s3://b/dr")
WRITE = Wanted(enabled=False, source="s3://b/events", own="s3://b/dr")


def seen(recorded=WRITER, pods=1, claims=1, rolled=True, previous=None) -> Seen:
    return Seen(recorded=recorded, pods=pods, claims=claims, rolled_out=rolled, previous=previous)


def reason(step) -> str | None:
    return None if step.condition is None else step.condition["reason"]


def test_a_new_replica_cluster_follows_and_says_so_without_an_event():
    step = decide(FOLLOW, seen(recorded=None, pods=0, claims=0, rolled=False))
    assert (step.follow, step.hold_at_zero, step.delete_claims) == (True, False, False)
    assert step.condition is not None and step.condition["status"] == "True"
    assert reason(step) == FOLLOWING
    assert step_events(None, step.condition) == []


def test_a_set_that_never_followed_has_no_condition():
    step = decide(Wanted(enabled=False, source=None, own="s3://b/x"), seen())
    assert (step.follow, step.hold_at_zero, step.condition) == (False, False, None)


def test_promotion_renders_writers_says_promoting_until_rolled_out_then_promoted():
    step = decide(WRITE, seen(recorded=FOLLOWER, previous=FOLLOWING))
    assert (step.follow, step.hold_at_zero, reason(step)) == (False, False, PROMOTING)
    assert [e[:2] for e in step_events(FOLLOWING, step.condition)] == [(False, "Promoting")]
    # Right after the apply the StatefulSet records writers, not yet rolled out.
    after = decide(WRITE, seen(recorded=WRITER, rolled=False, previous=FOLLOWING))
    assert reason(after) == PROMOTING
    still = decide(WRITE, seen(recorded=WRITER, rolled=False, previous=PROMOTING))
    assert reason(still) == PROMOTING and step_events(PROMOTING, still.condition) == []
    done = decide(WRITE, seen(recorded=WRITER, rolled=True, previous=PROMOTING))
    assert reason(done) == PROMOTED and done.condition["status"] == "False"
    assert "s3://b/dr" in done.condition["message"]
    assert [e[:2] for e in step_events(PROMOTING, done.condition)] == [(False, "Promoted")]
    # Promoted stays, also through a later rollout.
    assert reason(decide(WRITE, seen(recorded=WRITER, rolled=False, previous=PROMOTED))) == (
        PROMOTED
    )


def test_demotion_first_stops_the_writers_with_their_template_kept():
    step = decide(FOLLOW, seen(recorded=WRITER, pods=2, claims=2))
    assert (step.follow, step.hold_at_zero, step.delete_claims) == (False, True, False)
    assert reason(step) == DEMOTING
    assert [e[:2] for e in step_events(None, step.condition)] == [(False, "Demoting")]


def test_demotion_refuses_the_old_volumes_by_default_and_stays_stopped():
    step = decide(FOLLOW, seen(recorded=WRITER, pods=0, claims=2, previous=DEMOTING))
    assert (step.follow, step.hold_at_zero, step.delete_claims) == (False, True, False)
    assert reason(step) == DEMOTION_REFUSED
    assert "demotionPolicy: Rebuild" in step.condition["message"]
    assert [e[:2] for e in step_events(DEMOTING, step.condition)] == [(True, "DemotionRefused")]
    # Pods seen gone before they were seen stopping: Demoting is still said, first.
    assert [e[1] for e in step_events(None, step.condition)] == ["Demoting", "DemotionRefused"]


def test_demotion_with_rebuild_deletes_the_claims_then_renders_followers():
    want = Wanted(enabled=True, source="s3://b/events", own="s3://b/dr", policy=REBUILD)
    delete = decide(want, seen(recorded=WRITER, pods=0, claims=2, previous=DEMOTING))
    assert (delete.follow, delete.hold_at_zero, delete.delete_claims) == (False, True, True)
    assert reason(delete) == REBUILDING
    # Claims still going (deletion in progress): held, asked again.
    assert decide(want, seen(recorded=WRITER, pods=0, claims=1, previous=REBUILDING)).hold_at_zero
    render = decide(want, seen(recorded=WRITER, pods=0, claims=0, previous=REBUILDING))
    assert (render.follow, render.hold_at_zero, render.delete_claims) == (True, False, False)
    restoring = decide(want, seen(recorded=FOLLOWER, rolled=False, previous=REBUILDING))
    assert reason(restoring) == REBUILDING and restoring.follow
    done = decide(want, seen(recorded=FOLLOWER, rolled=True, previous=REBUILDING))
    assert reason(done) == FOLLOWING and done.condition["status"] == "True"
    assert [e[:2] for e in step_events(REBUILDING, done.condition)] == [(False, "Demoted")]


def test_a_promoted_set_must_not_archive_where_its_source_does():
    same = Wanted(enabled=False, source="s3://b/events", own="s3://b/events/")
    assert "two primaries" in (refused(same) or "")
    assert refused(WRITE) is None
    assert refused(Wanted(enabled=True, source="s3://b/e", own="s3://b/e")) is None
    assert "Refuse or Rebuild" in (refused(Wanted(True, "s3://b/e", None, "Wipe")) or "")


def test_rolled_out_needs_every_pod_on_the_current_generation_and_ready():
    sts = {
        "metadata": {"generation": 3},
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 3,
            "updateRevision": "r3",
            "currentRevision": "r3",
            "updatedReplicas": 2,
            "readyReplicas": 2,
        },
    }
    assert rolled_out(sts)
    assert not rolled_out({**sts, "metadata": {"generation": 4}})
    assert not rolled_out({**sts, "status": {**sts["status"], "readyReplicas": 1}})
    assert not rolled_out({**sts, "status": {**sts["status"], "currentRevision": "r2"}})
    assert not rolled_out({**sts, "spec": {"replicas": 0}})
    assert not rolled_out(None)


def ds(name: str, spec: dict) -> dict:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


STORE = {"destinationPath": "s3://b/dr", "endpointURL": "http://s3:8333"}


def test_the_plugins_patches():
    replica = ds("dr", {"replica": {"enabled": True, "source": {"destinationPath": "s3://b/e"}}})
    assert promotion_patch(replica) == {"spec": {"replica": {"enabled": False}}}
    with pytest.raises(PluginError, match="not a replica cluster"):
        promotion_patch(ds("events", {}))
    same = ds("dr", {**replica["spec"], "backup": {"objectStore": {"destinationPath": "s3://b/e"}}})
    with pytest.raises(PluginError, match="archive of its own"):
        promotion_patch(same)

    primary = ds("dr", {"backup": {"objectStore": STORE}})
    patch = demotion_patch(ds("events", {}), primary, rebuild=True)
    assert patch == {
        "spec": {"replica": {"enabled": True, "source": STORE, "demotionPolicy": "Rebuild"}}
    }
    assert demotion_patch(ds("events", {}), primary, False)["spec"]["replica"][
        "demotionPolicy"
    ] == ("Refuse")
    with pytest.raises(PluginError, match="no spec"):
        demotion_patch(ds("events", {}), ds("dr", {}), False)
    with pytest.raises(PluginError, match="promote it first"):
        demotion_patch(ds("events", {}), replica, False)
    with pytest.raises(PluginError, match="already"):
        demotion_patch(replica, primary, False)
