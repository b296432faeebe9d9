"""Status from observation (pure functions, no cluster).

One module just over 400 lines, kept whole: every case of the one pure function
``compute_status`` and its helpers.
"""

from __future__ import annotations

import json

from stream_operator.decisions.status import (
    Outcome,
    analytics_condition,
    compute_status,
    same_status,
)


def healthy_lease(replicas: int) -> dict:
    """The Lease of a replica set with every replica in sync (pod 0 the primary)."""
    standbys = [f"x-{i}" for i in range(1, replicas)]
    return {
        "metadata": {
            "annotations": {
                "streams.pyds.dev/term": "1",
                "streams.pyds.dev/in-sync": json.dumps(standbys),
            }
        },
        "spec": {"holderIdentity": "x-0"},
    }


def status_of(**kw):
    """compute_status with a healthy replica set's Lease unless the test gives one: the
    tests here are about the pods and the StatefulSet, not about who is in sync."""
    kw.setdefault("lease", healthy_lease(int((kw.get("spec") or {}).get("replicas", 1))))
    return compute_status(**kw)


def one_pod_status(pod):
    """A single server whose one pod is not ready: the status says why, from the pod."""
    return status_of(
        spec={"replicas": 1},
        generation=1,
        statefulset=sts(replicas=1, ready=0, updated=1),
        endpoint="e",
        pods=[pod],
    )


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
    s = status_of(spec={}, generation=1, statefulset=None, endpoint="e", outcome=Outcome())
    assert s["phase"] == "Pending" and s["readyReplicas"] == 0
    assert conds(s)["Ready"][0] == "False" and s["observedGeneration"] == 1


def test_all_ready():
    s = status_of(spec={"replicas": 3}, generation=4, statefulset=sts(), endpoint="http://x")
    assert s["phase"] == "Ready" and s["readyReplicas"] == 3 and s["endpoint"] == "http://x"
    assert conds(s)["Ready"] == ("True", "AllReplicasReady")
    assert conds(s)["Progressing"][0] == "False" and conds(s)["Degraded"][0] == "False"


def test_rolling_update_is_progressing():
    s = status_of(
        spec={"replicas": 3},
        generation=5,
        statefulset=sts(updated=1, cur="r1", upd="r2"),
        endpoint="e",
    )
    assert s["phase"] == "Progressing" and conds(s)["Progressing"] == ("True", "RollingUpdate")


def test_lost_pod_is_degraded():
    s = status_of(spec={"replicas": 3}, generation=5, statefulset=sts(ready=2), endpoint="e")
    assert s["phase"] == "Degraded" and conds(s)["Degraded"] == ("True", "PodsNotReady")


def test_refused_change_is_said():
    s = status_of(
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
    s = status_of(
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
    again = status_of(
        spec={"replicas": 3}, generation=2, statefulset=sts(), endpoint="e", previous=s
    )
    assert conds(again)["Accepted"] == ("False", "ExpansionNotAllowed")
    assert again["observedGeneration"] == 1 and again["phase"] == "Degraded"
    assert same_status(again, s)
    # Once applied, the generation is observed and the status is Ready.
    done = status_of(
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
    s = status_of(spec={}, generation=1, statefulset=None, endpoint="e")
    assert "observedGeneration" not in s and "Accepted" not in conds(s)


def test_transition_times_are_kept_while_the_status_holds():
    first = status_of(spec={"replicas": 3}, generation=1, statefulset=sts(), endpoint="e")
    first["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = status_of(
        spec={"replicas": 3}, generation=1, statefulset=sts(), endpoint="e", previous=first
    )
    assert again["conditions"][0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    flipped = status_of(
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


def pvc(name, request, capacity=None):
    out = {"metadata": {"name": name}, "spec": {"resources": {"requests": {"storage": request}}}}
    if capacity is not None:
        out["status"] = {"phase": "Bound", "capacity": {"storage": capacity}}
    return out


def test_ready_waits_until_every_volume_holds_the_spec_size():
    """Issue 15, finding 4: a claim asked for less (a new replica's, from the immutable
    template) or not yet resized is not Ready; retained claims past the replicas are not."""
    spec = {"replicas": 2, "storage": {"size": "5Gi"}}
    small = [pvc("data-ev-0", "5Gi", "5Gi"), pvc("data-ev-1", "5Gi", "1Gi")]
    s = status_of(
        spec=spec,
        generation=3,
        statefulset=sts(replicas=2, ready=2, updated=2),
        endpoint="e",
        pvcs=small,
    )
    assert conds(s)["Ready"] == ("False", "StorageResizing") and s["phase"] == "Progressing"
    assert conds(s)["Progressing"] == ("True", "StorageResizing")
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "volumes not yet at 5Gi: data-ev-1 holds 1Gi"
    done = [pvc("data-ev-0", "5Gi", "5Gi"), pvc("data-ev-1", "5Gi"), pvc("data-ev-2", "1Gi")]
    s = status_of(
        spec=spec,
        generation=3,
        statefulset=sts(replicas=2, ready=2, updated=2),
        endpoint="e",
        pvcs=done,
    )
    assert s["phase"] == "Ready"


def server_pod(name, ready=False, restarts=0, state=None, last=None):
    return {
        "metadata": {"name": name},
        "status": {
            "containerStatuses": [
                {
                    "name": "server",
                    "ready": ready,
                    "restartCount": restarts,
                    "state": state or {"running": {}},
                    "lastState": last or {},
                }
            ]
        },
    }


LOG_TAIL = "\n".join(
    [
        '{"level": "info", "msg": "starting"}',
        '{"level": "error", "msg": "/data: data format 4 is not supported for writing '
        '(this program writes formats up to 3); run a newer server on this directory"}',
        "",
    ]
)


def test_a_crash_loop_says_why_in_the_servers_own_words():
    """Issue 15, findings 7 and 8: not "Progressing" for ever, but the reason and message."""
    pods = [
        server_pod("ev-0", ready=True),
        server_pod(
            "ev-1",
            restarts=4,
            state={"waiting": {"reason": "CrashLoopBackOff"}},
            last={"terminated": {"exitCode": 2, "reason": "Error", "message": LOG_TAIL}},
        ),
    ]
    rolling = sts(replicas=2, ready=1, updated=1, cur="r1", upd="r2")
    s = status_of(spec={"replicas": 2}, generation=2, statefulset=rolling, endpoint="e", pods=pods)
    assert s["phase"] == "Degraded"
    assert conds(s)["Ready"] == ("False", "CrashLoopBackOff")
    assert conds(s)["Degraded"] == ("True", "CrashLoopBackOff")
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert ready["message"] == (
        "pod ev-1: the server exited with code 2 (4 restarts): /data: data format 4 is not "
        "supported for writing (this program writes formats up to 3); run a newer server on "
        "this directory"
    )


def test_oom_and_image_pull_are_named_and_a_recovered_pod_is_not():
    oom = server_pod(
        "ev-0", restarts=2, last={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    )
    s = one_pod_status(oom)
    assert conds(s)["Ready"] == ("False", "OOMKilled") and s["phase"] == "Degraded"
    pull = server_pod(
        "ev-0",
        state={
            "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:9"'}
        },
    )
    s = one_pod_status(pull)
    assert conds(s)["Ready"] == ("False", "ImagePullBackOff")
    assert (
        'pulling image "x:9"' in next(c for c in s["conditions"] if c["type"] == "Ready")["message"]
    )
    # An OOM kill long ago, now ready: nothing to say; a pod still creating: nothing either.
    healed = server_pod("ev-0", ready=True, last={"terminated": {"reason": "OOMKilled"}})
    creating = server_pod("ev-1", state={"waiting": {"reason": "ContainerCreating"}})
    s = status_of(
        spec={"replicas": 2},
        generation=1,
        statefulset=sts(replicas=2, ready=1, updated=2),
        endpoint="e",
        pods=[healed, creating],
    )
    assert conds(s)["Ready"] == ("False", "ReplicasNotReady")


def test_a_failing_restore_init_container_says_why():
    """bootstrap.recovery's restore exits (no backup in the bucket): the server waits in
    PodInitializing, which says nothing; the init container's failure is the reason."""
    pod = server_pod("ev-0", state={"waiting": {"reason": "PodInitializing"}})
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "restore",
            "ready": False,
            "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
            "lastState": {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": '{"error": "the archive holds no finished backup to restore from"}',
                }
            },
        }
    ]
    s = one_pod_status(pod)
    assert conds(s)["Ready"] == ("False", "Init:CrashLoopBackOff") and s["phase"] == "Degraded"
    assert next(c for c in s["conditions"] if c["type"] == "Ready")["message"] == (
        "pod ev-0: the restore init container exited with code 1 (3 restarts): "
        "the archive holds no finished backup to restore from"
    )


# A pod no node takes, as kube-scheduler writes it (pkg/scheduler/schedule_one.go,
# handleSchedulingFailure: PodScheduled=False, reason v1.PodReasonUnschedulable, the
# framework's FitError message); phase Pending and no container states yet.
UNSCHEDULABLE = (
    "0/3 nodes are available: 1 node(s) had untolerated taint "
    "{node-role.kubernetes.io/control-plane: }, 2 Insufficient memory. preemption: 0/3 "
    "nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption "
    "victims found for incoming pod."
)


def pending_pod(name: str, reason: str = "Unschedulable", message: str = UNSCHEDULABLE) -> dict:
    return {
        "metadata": {"name": name},
        "status": {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": message,
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-11-29T14:00:00Z",
                }
            ],
        },
    }


def test_an_unschedulable_pod_says_what_the_scheduler_said():
    """Issue 42: a Pending pod read as ReplicasNotReady; now the scheduler's reason and
    message, and the spec fields that decide where a pod goes."""
    s = status_of(
        spec={"replicas": 3},
        generation=1,
        statefulset=sts(replicas=3, ready=2, updated=3),
        endpoint="e",
        pods=[server_pod("ev-0", ready=True), server_pod("ev-1", ready=True), pending_pod("ev-2")],
    )
    assert conds(s)["Ready"] == ("False", "Unschedulable")
    assert conds(s)["Degraded"] == ("True", "Unschedulable")
    message = next(c for c in s["conditions"] if c["type"] == "Ready")["message"]
    assert message.startswith("pod ev-2 is not scheduled: 0/3 nodes are available: 1 node(s)")
    assert "2 Insufficient memory" in message and "spec.scheduling" in message
    # Once bound (PodScheduled True), waiting for its containers is nothing to report.
    bound = pending_pod("ev-2")
    bound["status"]["conditions"][0] |= {"status": "True", "reason": None, "message": None}
    s = status_of(
        spec={"replicas": 3},
        generation=1,
        statefulset=sts(replicas=3, ready=2, updated=3),
        endpoint="e",
        pods=[server_pod("ev-0", ready=True), server_pod("ev-1", ready=True), bound],
    )
    assert conds(s)["Ready"] == ("False", "ReplicasNotReady")


def test_a_gated_pod_and_an_unbound_volume_are_named():
    gated = pending_pod(
        "ev-0", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"
    )
    volume = pending_pod(
        "ev-0",
        message="0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
        "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
    )
    for pod, reason, said in (
        (gated, "SchedulingGated", "scheduling gates"),
        (volume, "Unschedulable", "unbound immediate PersistentVolumeClaims"),
    ):
        s = one_pod_status(pod)
        assert conds(s)["Ready"] == ("False", reason) and s["phase"] == "Degraded"
        assert said in next(c for c in s["conditions"] if c["type"] == "Ready")["message"]


def test_image_pull_and_config_errors_carry_the_kubelets_message():
    """The waiting reasons and messages as the kubelet writes them
    (pkg/kubelet/images: ErrImagePull with the runtime's error; kuberuntime:
    CreateContainerConfigError naming the missing Secret key)."""
    cases = {
        "ErrImagePull": "rpc error: code = NotFound desc = failed to pull and unpack image "
        '"docker.io/library/durable-streams-server:9.9": not found',
        "CreateContainerConfigError": "couldn't find key secret-key in Secret default/s3",
    }
    for reason, message in cases.items():
        pod = server_pod("ev-0", state={"waiting": {"reason": reason, "message": message}})
        s = one_pod_status(pod)
        assert conds(s)["Ready"] == ("False", reason)
        said = next(c for c in s["conditions"] if c["type"] == "Ready")["message"]
        assert said == f"pod ev-0: {message}"
