"""Status from observation (pure functions, no cluster)."""

from __future__ import annotations

from stream_operator.status import Outcome, analytics_condition, compute_status, same_status


def sts(replicas=3, ready=3, updated=3, generation=2, observed=2, cur="r1", upd="r1"):
    return {
        "metadata": {"generation": generation},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": observed,
            "currentRevision": cur,
            "updateRevision": upd,
        },
    }


def conds(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_no_statefulset_yet_is_pending():
    s = compute_status(spec={}, generation=1, statefulset=None, endpoint="e", outcome=Outcome())
    assert s["phase"] == "Pending" and s["readyReplicas"] == 0
    assert conds(s)["Ready"][0] == "False" and s["observedGeneration"] == 1


def test_all_ready():
    s = compute_status(spec={"replicas": 3}, generation=4, statefulset=sts(), endpoint="http://x")
    assert s["phase"] == "Ready" and s["readyReplicas"] == 3 and s["endpoint"] == "http://x"
    assert conds(s)["Ready"] == ("True", "AllReplicasReady")
    assert conds(s)["Progressing"][0] == "False" and conds(s)["Degraded"][0] == "False"


def test_rolling_update_is_progressing():
    s = compute_status(
        spec={"replicas": 3},
        generation=5,
        statefulset=sts(updated=1, cur="r1", upd="r2"),
        endpoint="e",
    )
    assert s["phase"] == "Progressing" and conds(s)["Progressing"] == ("True", "RollingUpdate")


def test_lost_pod_is_degraded():
    s = compute_status(spec={"replicas": 3}, generation=5, statefulset=sts(ready=2), endpoint="e")
    assert s["phase"] == "Degraded" and conds(s)["Degraded"] == ("True", "PodsNotReady")


def test_refused_change_is_said():
    s = compute_status(
        spec={"replicas": 3},
        generation=5,
        statefulset=sts(),
        endpoint="e",
        outcome=Outcome("ChangeRefused", "cannot shrink"),
        previous={"observedGeneration": 4},
    )
    assert conds(s)["Accepted"] == ("False", "ChangeRefused")
    assert s["phase"] == "Degraded"
    assert s["observedGeneration"] == 4  # generation 5 was not applied


def test_a_failed_change_is_not_ready_and_not_observed():
    """The pods serve, but the spec was not carried out: Ready=False with the reason."""
    failed = Outcome("ExpansionNotAllowed", "StorageClass fixed does not allow volume expansion")
    s = compute_status(
        spec={"replicas": 3},
        generation=2,
        statefulset=sts(),
        endpoint="e",
        outcome=failed,
        previous={"observedGeneration": 1},
    )
    assert conds(s)["Accepted"] == ("False", "ExpansionNotAllowed")
    assert conds(s)["Ready"] == ("False", "ExpansionNotAllowed")
    assert s["phase"] == "Degraded" and s["observedGeneration"] == 1
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert "does not allow volume expansion" in ready["message"]
    # Observing the pods again (no reconcile) keeps the outcome and the generation.
    again = compute_status(
        spec={"replicas": 3}, generation=2, statefulset=sts(), endpoint="e", previous=s
    )
    assert conds(again)["Accepted"] == ("False", "ExpansionNotAllowed")
    assert again["observedGeneration"] == 1 and again["phase"] == "Degraded"
    assert same_status(again, s)
    # Once applied, the generation is observed and the status is Ready.
    done = compute_status(
        spec={"replicas": 3},
        generation=2,
        statefulset=sts(),
        endpoint="e",
        outcome=Outcome(),
        previous=s,
    )
    assert done["observedGeneration"] == 2 and done["phase"] == "Ready"
    assert conds(done)["Accepted"] == ("True", "Applied") and not same_status(done, s)


def test_before_any_reconcile_nothing_is_claimed():
    s = compute_status(spec={}, generation=1, statefulset=None, endpoint="e")
    assert "observedGeneration" not in s and "Accepted" not in conds(s)


def test_transition_times_are_kept_while_the_status_holds():
    first = compute_status(spec={"replicas": 3}, generation=1, statefulset=sts(), endpoint="e")
    first["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = compute_status(
        spec={"replicas": 3}, generation=1, statefulset=sts(), endpoint="e", previous=first
    )
    assert again["conditions"][0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    flipped = compute_status(
        spec={"replicas": 3}, generation=1, statefulset=sts(ready=1), endpoint="e", previous=first
    )
    assert flipped["conditions"][0]["lastTransitionTime"] != "2020-01-01T00:00:00Z"


def test_analytics_condition_says_what_stops_the_jobs_or_how_many_run():
    (bad,) = analytics_condition(error="extract job 'x' needs fields")
    assert (bad["status"], bad["reason"]) == ("False", "InvalidAnalytics")
    assert "needs fields" in bad["message"]
    (missing,) = analytics_condition(spark_operator=False)
    assert (missing["status"], missing["reason"]) == ("False", "SparkOperatorMissing")
    apps = [{"spec": {"schedule": "@daily"}}] * 4
    (ok,) = analytics_condition(scheduled=apps)
    assert (ok["status"], ok["reason"]) == ("True", "Scheduled")
    assert ok["message"].startswith("4 ScheduledSparkApplication(s)") and "@daily" in ok["message"]
    assert analytics_condition() == []  # analytics off: no condition at all
