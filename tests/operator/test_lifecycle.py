"""The lifecycle annotations' pure decisions (stream_operator/decisions/lifecycle.py) and the kubelet
stand-in's downwardAPI volumes, which carry a pod's fence to its server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stream_operator.decisions.lifecycle import (
    FENCED_INSTANCES,
    HIBERNATION,
    POD_FENCED,
    RECONCILE,
    RESTARTED_AT,
    fence_changes,
    fenced_instances,
    hibernated,
    holds_rollout,
    lifecycle_status,
    paused,
    paused_status,
    restarted,
    wants_converge,
)
from stream_server.fencing import parse_annotations
from testkit.pod_objects import downward_text, downward_volumes, refresh_downward


def ds(annotations: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "ev", "namespace": "ns", "annotations": annotations or {}},
        "spec": {"replicas": 3},
        **extra,
    }


def pod(name: str, fenced: bool = False) -> dict[str, Any]:
    notes = {POD_FENCED: "true"} if fenced else {}
    return {"metadata": {"name": name, "annotations": notes}}


def sts(replicas: int, running: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}, "status": {"replicas": running}}


def test_the_annotations_are_read_as_cloudnativepg_reads_its_own():
    assert paused(ds({RECONCILE: "paused"})) and paused(ds({RECONCILE: " Paused "}))
    assert not paused(ds({RECONCILE: "enabled"})) and not paused(ds())
    assert fenced_instances(ds({FENCED_INSTANCES: '["ev-1"]'})) == (frozenset({"ev-1"}), None)
    assert fenced_instances(ds({FENCED_INSTANCES: '["*"]'}))[0] == {"*"}
    assert fenced_instances(ds({FENCED_INSTANCES: ""})) == (frozenset(), None)
    names, error = fenced_instances(ds({FENCED_INSTANCES: "ev-1"}))
    assert not names and error and "JSON list" in error


def test_the_fence_is_written_on_the_pods_it_names_and_taken_off_the_others():
    pods = [pod("ev-0"), pod("ev-1", fenced=True), pod("ev-2")]
    assert fence_changes(frozenset({"ev-0"}), pods) == [("ev-0", True), ("ev-1", False)]
    assert fence_changes(frozenset({"*"}), pods) == [("ev-0", True), ("ev-2", True)]
    assert fence_changes(frozenset(), pods) == [("ev-1", False)]
    # A fenced pod is never replaced by a rolling update: the update waits.
    assert holds_rollout(ds(), pods) and not holds_rollout(ds(), [pod("ev-0")])
    assert holds_rollout(ds({HIBERNATION: "on"}), [])


def test_hibernation_renders_no_replicas_and_a_round_converges_until_it_is_so():
    on = ds({HIBERNATION: "on"})
    assert hibernated(on, {"spec": {"replicas": 3}})["spec"]["replicas"] == 0
    assert hibernated(ds(), {"spec": {"replicas": 3}})["spec"]["replicas"] == 3
    assert wants_converge(on, sts(3, 3)) and not wants_converge(on, sts(0, 0))
    off = ds({HIBERNATION: "off"})
    assert wants_converge(off, sts(0, 0)) and not wants_converge(off, sts(3, 3))
    # Paused: nothing converges; a resume does.
    assert not wants_converge(ds({RECONCILE: "paused", HIBERNATION: "on"}), sts(3, 3))
    was = paused_status({"phase": "Ready", "conditions": []})
    assert wants_converge(ds(status=was), sts(3, 3))


def test_a_restart_asked_on_the_durable_stream_goes_into_the_pod_template():
    """kubectl dstream restart: the template carries the DurableStream's restartedAt (a
    new revision the operator rolls), and a status round converges until it does."""
    asked = ds({RESTARTED_AT: "2026-11-29T15:00:00Z"})
    rendered = restarted(asked, {"spec": {"replicas": 3, "template": {"metadata": {}}}})
    assert rendered["spec"]["template"]["metadata"]["annotations"] == {
        RESTARTED_AT: "2026-11-29T15:00:00Z"
    }
    plain = restarted(ds(), {"spec": {"replicas": 3, "template": {"metadata": {}}}})
    assert plain["spec"]["template"]["metadata"] == {}
    live = {**sts(3, 3), "spec": {"replicas": 3, "template": {"metadata": {}}}}
    assert wants_converge(asked, live) and not wants_converge(ds(), live)
    assert not wants_converge(asked, rendered)
    assert not wants_converge(ds({RECONCILE: "paused", RESTARTED_AT: "x"}), live)


def test_a_paused_status_is_the_last_one_with_its_condition():
    before = {"phase": "Ready", "readyReplicas": 3, "conditions": [{"type": "Ready"}]}
    held = paused_status(before)
    assert held["phase"] == "Ready" and held["readyReplicas"] == 3
    paused_cond = held["conditions"][-1]
    assert (paused_cond["type"], paused_cond["status"]) == ("ReconcilePaused", "True")
    assert paused_status(held)["conditions"] == held["conditions"]  # stamped once


def test_the_status_says_hibernating_then_hibernated_then_waking():
    ready_cond = {"type": "Ready", "status": "False", "reason": "ReplicasNotReady"}
    base = {"phase": "Degraded", "conditions": [ready_cond]}
    on = ds({HIBERNATION: "on"})
    going = lifecycle_status(on, sts(0, 2), [pod("ev-0"), pod("ev-1")], base)
    assert going["phase"] == "Hibernating"
    done = lifecycle_status(on, sts(0, 0), [], base)
    assert done["phase"] == "Hibernated"
    reasons = {c["type"]: (c["status"], c["reason"]) for c in done["conditions"]}
    assert reasons["Hibernated"] == ("True", "Hibernated")
    assert reasons["Ready"] == ("False", "Hibernated")
    woken = lifecycle_status(ds(status=done), sts(3, 1), [pod("ev-0")], base)
    assert {c["type"]: c["reason"] for c in woken["conditions"]}["Hibernated"] == "Waking"
    ready = lifecycle_status(ds(status=woken), sts(3, 3), [], {**base, "phase": "Ready"})
    assert {c["type"]: c["reason"] for c in ready["conditions"]}["Hibernated"] == "Awake"
    assert all("lastTransitionTime" in c for c in ready["conditions"] if c["type"] != "Ready")
    never = lifecycle_status(ds(), sts(3, 3), [], {**base, "phase": "Ready"})
    assert "Hibernated" not in {c["type"] for c in never["conditions"]}


def test_the_fence_shows_in_the_status():
    fenced = ds({FENCED_INSTANCES: json.dumps(["ev-1"])})
    st = lifecycle_status(fenced, sts(3, 3), [pod("ev-1", fenced=True)], {"conditions": []})
    cond = st["conditions"][-1]
    assert (cond["type"], cond["status"]) == ("Fenced", "True") and "ev-1" in cond["message"]
    bad = lifecycle_status(ds({FENCED_INSTANCES: "x"}), None, [], {"conditions": []})
    assert bad["conditions"][-1]["reason"] == "InvalidFencedInstances"


def test_the_stand_in_writes_downward_api_files_as_the_kubelet_does(tmp_path: Path):
    """A downwardAPI volume of the pod's annotations: the stand-in writes them as
    ``key="value"`` lines the server parses back, and rewrites the file (whole) when the
    annotations change. (The operator's pods mount them in a projected volume, whose
    downward API files are written by the same code: test_kubelet_projected.py.)"""
    item = {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
    volume = {"name": "podinfo", "downwardAPI": {"items": [item]}}
    mount = {"name": "podinfo", "mountPath": "/etc/durable-streams/podinfo"}
    template = {"spec": {"volumes": [volume], "containers": [{"volumeMounts": [mount]}]}}
    meta = {"name": "ev-0", "annotations": {"b": 'say "hi"\n', "a": "1"}}
    mounts, files = downward_volumes(template, meta, tmp_path)
    assert list(mounts) == ["/etc/durable-streams/podinfo"]
    [(path, field_path)] = files
    assert field_path == "metadata.annotations"
    assert path.read_text() == 'a="1"\nb="say \\"hi\\"\\n"'
    assert parse_annotations(path.read_text()) == meta["annotations"]
    assert not refresh_downward(files, meta)  # unchanged: not rewritten
    assert refresh_downward(files, {**meta, "annotations": {POD_FENCED: "true"}})
    assert parse_annotations(path.read_text()) == {POD_FENCED: "true"}
    assert downward_text({"name": "ev-0"}, "metadata.name") == "ev-0"
