"""The real kopf operator against an emulated API server (testkit.kube).
Long: the reconcile scenarios over one cluster fixture; a split by concern
(rendering, storage, status) is open.

Each test starts an API server and the operator, acts the way a user would
(create, patch, delete DurableStreams through the API), plays the StatefulSet
controller where one is needed (status, PVCs), and checks what the operator
did to the cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from stream_format.layout import WRITE_VERSION
from stream_operator import KIND
from testkit import free_port, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream, storage_class
from testkit.kubelet import Kubelet
from testkit.leases import replica_lease
from testkit.operator import running_operator
from testkit.operator_rbac import operated_cluster
from testkit.pod_objects import (
    claim_volumes,
    container_env,
    failed_pod,
    statefulset_status,
    termination_message,
)

pytestmark = pytest.mark.processes

NS = "default"


def play_statefulset_controller(c: Cluster, name: str, ready: int | None = None) -> None:
    """What the StatefulSet controller and kubelet would report: PVCs, then pod counts."""
    sts = c.get("StatefulSet", NS, name)
    want = sts["spec"]["replicas"]
    claim_volumes(c, sts)
    revision = f"{name}-{sts['metadata']['generation']}"
    status = statefulset_status(
        sts, want, want if ready is None else ready, want, revision, revision
    )
    c.patch("StatefulSet", NS, name, {"status": status}, status=True).raise_for_status()


def status_of(c: Cluster, name: str) -> dict[str, Any]:
    obj = c.get(KIND, NS, name) or {}
    return obj.get("status") or {}


def condition(c: Cluster, name: str, ctype: str) -> dict[str, Any]:
    for cond in status_of(c, name).get("conditions") or []:
        if cond["type"] == ctype:
            return cond
    return {}


def operator_calls(c: Cluster) -> set[tuple[str, str, str]]:
    """What the operator (kopf and the handlers' client) asked of the API server."""
    return {call[:3] for call in c.api.requests if not call.agent.startswith("python-httpx/")}


def handler_reads(c: Cluster, resource: str, name: str) -> int:
    """How often the operator's handlers (not kopf, not the test) read one object: each
    round of an object starts from a fresh read of it, and each reconcile (none of the
    status rounds) asks whether the PodMonitor kind is served. So the test waits for
    rounds the operator made, as the API server saw them, instead of for a time."""
    return sum(
        1
        for call in c.api.requests
        if call.verb == "get"
        and (call.resource, call.name) == (resource, name)
        and not call.agent.startswith(("python-httpx/", "kopf/"))
    )


def rounds(c: Cluster, name: str) -> int:
    """The reconciles and status rounds of DurableStream ``name`` begun so far."""
    return handler_reads(c, "durablestreams", name)


def reconciles(c: Cluster) -> int:
    """The reconciles (of any DurableStream) begun so far."""
    return handler_reads(c, "customresourcedefinitions", "podmonitors.monitoring.coreos.com")


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with operated_cluster() as c:
        yield c


def test_create_renders_every_object_with_owner_references(kube: Cluster):
    kube.create(durable_stream("events", {"replicas": 2})).raise_for_status()
    sts = wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    owner_uid = kube.get(KIND, NS, "events")["metadata"]["uid"]
    for kind, name in [
        ("ConfigMap", "events-config"),
        ("Service", "events"),
        ("Service", "events-headless"),
        ("PodDisruptionBudget", "events"),
        ("StatefulSet", "events"),
    ]:
        obj = wait_for(lambda k=kind, n=name: kube.get(k, NS, n), message=f"{kind} {name}")
        refs = obj["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs] == [owner_uid], (kind, name)
    assert sts["spec"]["replicas"] == 2
    # Nothing is ready yet: the status says so.
    wait_for(lambda: status_of(kube, "events").get("phase"), message="a phase")
    assert status_of(kube, "events")["readyReplicas"] == 0
    assert condition(kube, "events", "Ready")["status"] == "False"
    # The controller reports both pods ready: the status follows.
    play_statefulset_controller(kube, "events")
    wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", message="Ready")
    st = status_of(kube, "events")
    assert st["readyReplicas"] == 2
    # A replica set serves TLS from the built-in CA by default (builtin_ca.py).
    assert st["endpoint"] == "https://events.default.svc:4437/v1/stream/"
    assert st["observedGeneration"] == 1
    kube.wait_for_event(NS, "events", "Created")  # created after the objects


def healthy_lease(name: str, replicas: int) -> dict[str, Any]:
    """A replica set's Lease as its servers write it with every replica in sync."""
    return replica_lease(name, NS, f"{name}-0", 1, [f"{name}-{i}" for i in range(1, replicas)])


def _ready(kube: Cluster, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create a DurableStream, play its controller, wait until the operator says Ready;
    a replica set's servers have elected a primary and are all in sync."""
    kube.create(durable_stream(name, spec)).raise_for_status()
    replicas = int((spec or {}).get("replicas", 1))
    if replicas > 1:
        kube.create(healthy_lease(name, replicas)).raise_for_status()
    wait_for(lambda: kube.get("StatefulSet", NS, name), message="StatefulSet")
    play_statefulset_controller(kube, name)
    wait_for(lambda: status_of(kube, name).get("phase") == "Ready", message="Ready")
    return kube.get("StatefulSet", NS, name)


def test_update_image_and_replicas_rolls_the_statefulset(kube: Cluster):
    before = _ready(kube, "events")
    kube.patch(KIND, NS, "events", {"spec": {"image": "durable-streams-py:0.2.0", "replicas": 3}})
    after = wait_for(
        lambda: (s := kube.get("StatefulSet", NS, "events"))["spec"]["replicas"] == 3 and s,
        message="replicas 3",
    )
    container = after["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "durable-streams-py:0.2.0"
    hash_key = "streams.pyds.dev/config-hash"
    old_hash = before["spec"]["template"]["metadata"]["annotations"][hash_key]
    assert after["spec"]["template"]["metadata"]["annotations"][hash_key] != old_hash
    # The rollout has not been reported yet: the status says it is progressing.
    wait_for(
        lambda: condition(kube, "events", "Progressing").get("status") == "True",
        message="Progressing",
    )
    assert status_of(kube, "events")["phase"] == "Progressing"
    play_statefulset_controller(kube, "events")
    wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", message="Ready again")
    assert status_of(kube, "events")["observedGeneration"] == 2


def test_a_server_setting_changes_the_configmap_and_rolls_the_pods(kube: Cluster):
    before = _ready(kube, "events")
    key = "streams.pyds.dev/config-hash"
    old_hash = before["spec"]["template"]["metadata"]["annotations"][key]
    kube.patch(KIND, NS, "events", {"spec": {"server": {"longPollTimeoutSeconds": 5}}})
    wait_for(
        lambda: (
            kube.get("StatefulSet", NS, "events")["spec"]["template"]["metadata"]["annotations"][
                key
            ]
            != old_hash
        ),
        message="a new config hash on the pod template (the pods roll)",
    )
    cm = kube.get("ConfigMap", NS, "events-config")
    assert cm["data"]["DS_LONG_POLL_TIMEOUT"] == "5"


def test_a_setting_removed_from_the_spec_is_removed_from_the_statefulset(kube: Cluster):
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "streams"}]
    sts = _ready(kube, "events", {"scheduling": {"tolerations": tolerations}})
    assert sts["spec"]["template"]["spec"]["tolerations"] == tolerations
    kube.patch(KIND, NS, "events", {"spec": {"scheduling": {"tolerations": None}}})
    # Server-side apply: a field the operator no longer sends is dropped, not kept.
    wait_for(
        lambda: (
            "tolerations" not in kube.get("StatefulSet", NS, "events")["spec"]["template"]["spec"]
        ),
        message="the tolerations gone from the pod template",
    )


def test_storage_growth_expands_every_pvc(kube: Cluster):
    _ready(kube, "events", {"replicas": 2, "storage": {"size": "1Gi"}})
    kube.patch(KIND, NS, "events", {"spec": {"storage": {"size": "5Gi"}}})

    def sizes() -> list[str]:
        return [
            kube.get("PersistentVolumeClaim", NS, f"data-events-{i}")["spec"]["resources"][
                "requests"
            ]["storage"]
            for i in range(2)
        ]

    wait_for(lambda: sizes() == ["5Gi", "5Gi"], message="both PVCs at 5Gi")
    # The claim template cannot change on a live StatefulSet: it is left as it was.
    sts = kube.get("StatefulSet", NS, "events")
    template = sts["spec"]["volumeClaimTemplates"][0]
    assert template["spec"]["resources"]["requests"]["storage"] == "1Gi"
    kube.wait_for_event(NS, "events", "Expanding")


@pytest.mark.parametrize(
    ("change", "reason_part"),
    [
        ({"storage": {"size": "1Gi"}}, "cannot shrink"),
        ({"storage": {"storageClassName": "slow"}}, "storageClassName cannot change"),
    ],
)
def test_a_change_that_cannot_be_carried_out_is_refused_whole(kube: Cluster, change, reason_part):
    before = _ready(kube, "events", {"storage": {"size": "2Gi"}, "image": "img:1"})
    # The CRD's transition rules refuse it first (422); the operator's own refusal is for
    # a cluster whose CRD has none.
    assert kube.patch(KIND, NS, "events", {"spec": change}).status_code == 422
    kube.serve_crd_without_rules()
    # The refused change comes with a harmless one: neither is applied (never half-applied).
    kube.patch(KIND, NS, "events", {"spec": {**change, "image": "img:2"}})
    wait_for(
        lambda: condition(kube, "events", "Accepted").get("status") == "False",
        message="Accepted=False",
    )
    accepted = condition(kube, "events", "Accepted")
    assert accepted["reason"] == "ChangeRefused" and reason_part in accepted["message"]
    assert status_of(kube, "events")["phase"] == "Degraded"
    sts = kube.get("StatefulSet", NS, "events")
    assert sts["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"
    pvc = kube.get("PersistentVolumeClaim", NS, "data-events-0")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
    kube.wait_for_event(NS, "events", "ChangeRefused")
    # Undoing the refused part lets the rest through.
    undo = {"storage": {"size": "2Gi", "storageClassName": None}, "image": "img:2"}
    kube.patch(KIND, NS, "events", {"spec": undo})
    wait_for(
        lambda: (
            kube.get("StatefulSet", NS, "events")["spec"]["template"]["spec"]["containers"][0][
                "image"
            ]
            == "img:2"
        ),
        message="the harmless change applied after the undo",
    )
    wait_for(
        lambda: condition(kube, "events", "Accepted").get("status") == "True",
        message="Accepted=True",
    )


def test_subscriptions_and_retention_reach_the_servers_and_bad_ones_do_not(kube: Cluster):
    server = {
        "subscriptions": {
            "webhookAllow": ["receiver.jobs.svc"],
            "publicURL": "http://events.default.svc:4437",
        },
        "retention": [{"prefix": "logs/", "maxBytes": "10Gi", "maxAge": "7d"}],
    }
    before = _ready(kube, "events", {"server": server})
    data = kube.get("ConfigMap", NS, "events-config")["data"]
    assert data["DS_WEBHOOK_ALLOW"] == "receiver.jobs.svc"
    assert data["DS_PUBLIC_URL"] == "http://events.default.svc:4437"
    assert data["DS_RETENTION"] == "logs/:max-bytes=10GiB,max-age=7d"
    # A malformed size: the API server refuses it (the schema's pattern), nothing changes.
    bad = {"spec": {"server": {"retention": [{"prefix": "logs/", "maxBytes": "10G"}]}}}
    assert kube.patch(KIND, NS, "events", bad).status_code == 422
    # An entry without a rule: the CRD's CEL rule refuses it (422); on a cluster whose CRD
    # has no rules, the operator refuses it and the servers keep their policy.
    no_rule = {"spec": {"server": {"retention": [{"prefix": "logs/"}]}}}
    assert kube.patch(KIND, NS, "events", no_rule).status_code == 422
    kube.serve_crd_without_rules()
    kube.patch(KIND, NS, "events", no_rule)
    wait_for(
        lambda: condition(kube, "events", "Accepted").get("reason") == "ChangeRefused",
        message="Accepted=False, ChangeRefused",
    )
    assert "neither maxBytes nor maxAge" in condition(kube, "events", "Accepted")["message"]
    assert kube.get("ConfigMap", NS, "events-config")["data"]["DS_RETENTION"] == (
        "logs/:max-bytes=10GiB,max-age=7d"
    )
    sts = kube.get("StatefulSet", NS, "events")
    assert sts["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_degraded_when_a_pod_is_not_ready_and_recovers(kube: Cluster):
    _ready(kube, "events", {"replicas": 3})
    play_statefulset_controller(kube, "events", ready=2)
    wait_for(lambda: status_of(kube, "events").get("phase") == "Degraded", message="Degraded")
    degraded = condition(kube, "events", "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PodsNotReady"
    assert status_of(kube, "events")["readyReplicas"] == 2
    play_statefulset_controller(kube, "events")
    wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", message="Ready")
    assert condition(kube, "events", "Degraded")["status"] == "False"


@pytest.mark.parametrize("retention", ["Retain", "Delete"])
def test_delete_follows_the_pvc_retention(kube: Cluster, retention: str):
    _ready(kube, "events", {"replicas": 2, "storage": {"pvcRetention": retention}})
    # A finalizer only where the operator has work to do at deletion (tests/operator/test_rbac.py).
    assert bool(kube.get(KIND, NS, "events")["metadata"].get("finalizers")) == (
        retention == "Delete"
    )
    kube.delete(KIND, NS, "events").raise_for_status()
    wait_for(lambda: kube.get(KIND, NS, "events") is None, message="the DurableStream gone")
    # Owned objects go by garbage collection (owner references), which is asynchronous:
    # a round that read the object before it went may apply one more, collected after.
    wait_for(
        lambda: (
            kube.get("StatefulSet", NS, "events") is None
            and kube.get("ConfigMap", NS, "events-config") is None
        ),
        message="the owned StatefulSet and ConfigMap collected",
    )
    pvcs = {p["metadata"]["name"] for p in kube.list("PersistentVolumeClaim", NS)}
    if retention == "Retain":
        assert pvcs == {"data-events-0", "data-events-1"}
    else:
        assert pvcs == set()


def test_operator_restart_touches_nothing_that_is_already_right():
    with cluster() as kube:
        with running_operator(kube):
            _ready(kube, "events", {"replicas": 2})
            # Two more rounds: one began and ended after Ready was written (an object is on
            # one worker at a time), so the status is settled.
            seen = rounds(kube, "events")
            wait_for(lambda: rounds(kube, "events") >= seen + 2, message="two status rounds")
        owned = [
            ("ConfigMap", "events-config"),
            ("Service", "events"),
            ("Service", "events-headless"),
            ("PodDisruptionBudget", "events"),
            ("StatefulSet", "events"),
            ("PersistentVolumeClaim", "data-events-0"),
            ("ServiceAccount", "events"),
            ("Role", "events"),
            ("RoleBinding", "events"),
            ("Service", "events-replicas"),
            ("NetworkPolicy", "events"),
        ]
        versions = {k: kube.get(*k[:1], NS, k[1])["metadata"]["resourceVersion"] for k in owned}
        ds_version = kube.get(KIND, NS, "events")["metadata"]["resourceVersion"]
        before = reconciles(kube)
        with running_operator(kube):
            # The resume handler's reconcile, then resyncs and status rounds after it.
            wait_for(lambda: reconciles(kube) >= before + 3, message="resume and two resyncs")
            seen = rounds(kube, "events")
            wait_for(lambda: rounds(kube, "events") >= seen + 2, message="two more rounds")
            after = {k: kube.get(*k[:1], NS, k[1])["metadata"]["resourceVersion"] for k in owned}
            assert after == versions
            assert kube.get(KIND, NS, "events")["metadata"]["resourceVersion"] == ds_version
            created = [
                e
                for e in kube.list("Event", NS)
                if e["reason"] == "Created" and e["involvedObject"]["name"] == "events"
            ]
            # From the first run only: a replica set's 10 objects (its NetworkPolicy too)
            # and its peer token Secret.
            assert len(created) == 11
            # Resyncs ran, and found nothing to correct: no write, no event.
            rewritten = [
                e
                for e in kube.list("Event", NS)
                if e["reason"] in ("Patched", "DriftCorrected", "Deleted")
            ]
            assert rewritten == [], [e["message"] for e in rewritten]
            # And it is still watching: a change made now is carried out.
            kube.patch(KIND, NS, "events", {"spec": {"replicas": 3}})
            wait_for(
                lambda: kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 3,
                message="replicas 3 after the restart",
            )


def pvc_sizes(kube: Cluster, name: str, replicas: int) -> list[str]:
    return [
        kube.get("PersistentVolumeClaim", NS, f"data-{name}-{i}")["spec"]["resources"]["requests"][
            "storage"
        ]
        for i in range(replicas)
    ]


def test_growth_the_storage_class_cannot_make_is_reported_not_claimed(kube: Cluster):
    """Issue 15, finding 1: a refused expansion must not read as applied and Ready."""
    kube.create(storage_class("fixed", expandable=None)).raise_for_status()
    spec = {"replicas": 2, "storage": {"size": "1Gi", "storageClassName": "fixed"}}
    _ready(kube, "events", spec)
    kube.patch(KIND, NS, "events", {"spec": {"storage": {"size": "5Gi"}}}).raise_for_status()
    assert kube.get(KIND, NS, "events")["metadata"]["generation"] == 2
    wait_for(
        lambda: condition(kube, "events", "Accepted").get("reason") == "ExpansionNotAllowed",
        message="Accepted=False, ExpansionNotAllowed",
    )
    accepted = condition(kube, "events", "Accepted")
    assert accepted["status"] == "False"
    assert "StorageClass fixed does not allow volume expansion" in accepted["message"]
    assert "5Gi" in accepted["message"]
    ready = condition(kube, "events", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ExpansionNotAllowed")
    st = status_of(kube, "events")
    assert st["phase"] == "Degraded" and st["observedGeneration"] == 1
    assert pvc_sizes(kube, "events", 2) == ["1Gi", "1Gi"]
    warnings = kube.wait_for_event(NS, "events", "ExpansionNotAllowed")
    assert warnings[0]["type"] == "Warning"
    # Status ticks and resyncs keep saying so; the operator never asks for what the
    # API server would refuse.
    before, seen = reconciles(kube), rounds(kube, "events")
    wait_for(lambda: reconciles(kube) >= before + 2, message="two resyncs")
    wait_for(lambda: rounds(kube, "events") >= seen + 4, message="status rounds after them")
    assert condition(kube, "events", "Accepted")["reason"] == "ExpansionNotAllowed"
    assert status_of(kube, "events")["observedGeneration"] == 1
    assert ("patch", "", "persistentvolumeclaims") not in operator_calls(kube)
    # The administrator allows expansion: the next resync grows the volumes, and only
    # then is generation 2 observed.
    kube.patch("StorageClass", None, "fixed", {"allowVolumeExpansion": True}).raise_for_status()
    wait_for(lambda: pvc_sizes(kube, "events", 2) == ["5Gi", "5Gi"], message="PVCs at 5Gi")
    wait_for(
        lambda: status_of(kube, "events").get("observedGeneration") == 2,
        message="generation 2 observed",
    )
    assert condition(kube, "events", "Accepted")["status"] == "True"
    play_statefulset_controller(kube, "events")  # the resizer makes the volumes 5Gi
    wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", message="Ready")


def test_a_change_the_api_server_refuses_is_reported_not_observed(kube: Cluster):
    """Issue 15, finding 1: an API error during a reconcile is said, with its message."""
    # A PodMonitor CRD whose schema refuses what the operator renders (422).
    strict = {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"jobLabel": {"type": "integer"}}}},
    }
    kube.install_podmonitor_crd(strict)
    kube.create(durable_stream("events", {"metrics": {"podMonitor": {"enabled": True}}}))
    wait_for(
        lambda: condition(kube, "events", "Accepted").get("reason") == "ApplyFailed",
        message="Accepted=False, ApplyFailed",
    )
    accepted = condition(kube, "events", "Accepted")
    assert accepted["status"] == "False" and "422" in accepted["message"]
    assert "jobLabel" in accepted["message"]
    assert "observedGeneration" not in status_of(kube, "events")  # nothing applied yet
    off = {"metrics": {"podMonitor": {"enabled": False}}}
    kube.patch(KIND, NS, "events", {"spec": off}).raise_for_status()
    wait_for(
        lambda: status_of(kube, "events").get("observedGeneration") == 2,
        message="generation 2 observed",
    )
    assert condition(kube, "events", "Accepted")["status"] == "True"


def test_drift_is_corrected(kube: Cluster):
    """Issue 15, finding 2: a deleted Service comes back, a hand-made scale is undone."""
    _ready(kube, "events", {"replicas": 2})
    service = kube.get("Service", NS, "events")
    kube.delete("Service", NS, "events").raise_for_status()
    back = wait_for(
        lambda: (
            (s := kube.get("Service", NS, "events"))
            and s["metadata"]["uid"] != service["metadata"]["uid"]
            and s
        ),
        message="the client Service recreated",
    )
    # As rendered; the API server allocates the new Service another cluster IP.
    allocated = ("clusterIP", "clusterIPs")
    assert {k: v for k, v in back["spec"].items() if k not in allocated} == {
        k: v for k, v in service["spec"].items() if k not in allocated
    }
    kube.patch("StatefulSet", NS, "events", {"spec": {"replicas": 0}}).raise_for_status()
    wait_for(
        lambda: kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 2,
        message="replicas back at 2",
    )
    # Said after it is done: kopf posts its Events from a queue, so seeing the StatefulSet
    # at 2 does not mean the Event is there yet (a loaded machine saw it missing).
    corrected = kube.wait_for_event(NS, "events", "DriftCorrected", containing="spec.replicas")
    assert corrected[0]["type"] == "Warning"


def test_a_monitor_no_longer_rendered_is_deleted(kube: Cluster):
    """Issue 15, finding 3: what the operator stops rendering goes; nothing else does."""
    kube.install_podmonitor_crd()
    _ready(kube, "events", {"metrics": {"podMonitor": {"enabled": True}}})
    monitor = wait_for(lambda: kube.get("PodMonitor", NS, "events"), message="PodMonitor")
    # Same labels, made by hand (no owner reference): not the operator's to delete.
    hand_made = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": "events-by-hand",
            "namespace": NS,
            "labels": monitor["metadata"]["labels"],
        },
        "spec": monitor["spec"],
    }
    kube.create(hand_made).raise_for_status()
    off = {"metrics": {"podMonitor": {"enabled": False}}}
    kube.patch(KIND, NS, "events", {"spec": off}).raise_for_status()
    wait_for(lambda: kube.get("PodMonitor", NS, "events") is None, message="it is deleted")
    assert kube.get("PodMonitor", NS, "events-by-hand") is not None
    assert kube.get("Service", NS, "events") is not None  # still rendered, kept
    deleted = [
        e
        for e in kube.list("Event", NS)
        if e["reason"] == "Deleted" and e["involvedObject"]["name"] == "events"
    ]
    assert [e["message"] for e in deleted] == ["deleted PodMonitor events: no longer rendered"]
    # Turned on again, it comes back.
    kube.patch(KIND, NS, "events", {"spec": {"metrics": {"podMonitor": {"enabled": True}}}})
    wait_for(lambda: kube.get("PodMonitor", NS, "events"), message="PodMonitor again")


ANALYTICS = {
    "enabled": True,
    "schedule": "@daily",
    "output": {"claimName": "analytics-out"},
    "jobs": [
        {"name": "stats", "type": "stream-stats"},
        {"name": "orders", "type": "extract", "streams": "orders/*", "fields": ["id", "total"]},
    ],
}


def scheduled_apps(kube: Cluster) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in kube.list("ScheduledSparkApplication", NS)}


def test_analytics_waits_for_the_spark_operator_then_schedules_jobs(kube: Cluster):
    _ready(kube, "events", {"replicas": 2, "analytics": ANALYTICS})
    wait_for(lambda: condition(kube, "events", "Analytics"), message="an Analytics condition")
    missing = condition(kube, "events", "Analytics")
    assert (missing["status"], missing["reason"]) == ("False", "SparkOperatorMissing")
    assert status_of(kube, "events")["phase"] == "Ready"  # the servers are fine
    # The Spark Operator is installed later: the operator notices on its own.
    kube.install_spark_operator_crd()
    wait_for(
        lambda: condition(kube, "events", "Analytics").get("status") == "True",
        message="Analytics=True",
    )
    apps = scheduled_apps(kube)
    # A replica set's jobs read one copy: the in-sync standby's, never the primary's.
    assert sorted(apps) == ["events-1-orders", "events-1-stats"]
    owner_uid = kube.get(KIND, NS, "events")["metadata"]["uid"]
    for app in apps.values():
        assert [r["uid"] for r in app["metadata"]["ownerReferences"]] == [owner_uid]
        assert app["spec"]["schedule"] == "@daily"
    volumes = apps["events-1-stats"]["spec"]["template"]["volumes"]
    assert volumes[0]["persistentVolumeClaim"] == {"claimName": "data-events-1", "readOnly": True}

    # A job removed from the spec is unscheduled; the others stay as they were.
    kept = apps["events-1-stats"]["metadata"]["resourceVersion"]
    kube.patch(KIND, NS, "events", {"spec": {"analytics": {"jobs": ANALYTICS["jobs"][:1]}}})
    wait_for(
        lambda: sorted(scheduled_apps(kube)) == ["events-1-stats"],
        message="the orders jobs unscheduled",
    )
    assert scheduled_apps(kube)["events-1-stats"]["metadata"]["resourceVersion"] == kept

    # A spec the renderer cannot carry out is reported; what is scheduled stays.
    bad = {"jobs": [{"name": "x", "type": "extract"}]}  # extract without fields
    kube.patch(KIND, NS, "events", {"spec": {"analytics": bad}})
    wait_for(
        lambda: condition(kube, "events", "Analytics").get("reason") == "InvalidAnalytics",
        message="InvalidAnalytics",
    )
    assert "needs fields" in condition(kube, "events", "Analytics")["message"]
    assert sorted(scheduled_apps(kube)) == ["events-1-stats"]

    # Turning analytics off unschedules everything and drops the condition.
    kube.patch(KIND, NS, "events", {"spec": {"analytics": {"enabled": False}}})
    wait_for(lambda: not scheduled_apps(kube), message="no ScheduledSparkApplications")
    wait_for(lambda: not condition(kube, "events", "Analytics"), message="no Analytics condition")


def test_scheduled_jobs_go_with_their_durable_stream(kube: Cluster):
    kube.install_spark_operator_crd()
    _ready(kube, "events", {"analytics": ANALYTICS})
    wait_for(lambda: len(scheduled_apps(kube)) == 2, message="two ScheduledSparkApplications")
    kube.delete(KIND, NS, "events").raise_for_status()
    wait_for(lambda: kube.get(KIND, NS, "events") is None, message="the DurableStream gone")
    assert scheduled_apps(kube) == {}


def capacities(kube: Cluster, name: str, replicas: int) -> list[str]:
    return [
        kube.get("PersistentVolumeClaim", NS, f"data-{name}-{i}")["status"]["capacity"]["storage"]
        for i in range(replicas)
    ]


def test_new_replicas_get_the_spec_size_and_ready_waits_for_every_volume(kube: Cluster):
    """Issue 15, finding 4: grow to 5Gi, then scale 2 -> 3; the third volume is 5Gi too,
    and the status is not Ready while any volume holds less than the spec asks."""
    _ready(kube, "events", {"replicas": 2, "storage": {"size": "1Gi"}})
    kube.patch(KIND, NS, "events", {"spec": {"storage": {"size": "5Gi"}}}).raise_for_status()
    wait_for(lambda: pvc_sizes(kube, "events", 2) == ["5Gi", "5Gi"], message="5Gi asked for")
    # Asked for is not made: until the volumes are resized, the status says so.
    wait_for(
        lambda: condition(kube, "events", "Ready").get("reason") == "StorageResizing",
        message="Ready=False, StorageResizing",
    )
    ready = condition(kube, "events", "Ready")
    assert ready["status"] == "False"
    assert "data-events-0 holds 1Gi" in ready["message"] and "5Gi" in ready["message"]
    assert status_of(kube, "events")["phase"] == "Progressing"
    assert condition(kube, "events", "Progressing")["reason"] == "StorageResizing"
    play_statefulset_controller(kube, "events")  # the resizer finishes
    wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", message="Ready at 5Gi")
    assert capacities(kube, "events", 2) == ["5Gi", "5Gi"]

    kube.patch(KIND, NS, "events", {"spec": {"replicas": 3}}).raise_for_status()
    wait_for(
        lambda: kube.get("StatefulSet", NS, "events")["spec"]["replicas"] == 3,
        message="replicas 3",
    )
    # The StatefulSet controller makes the third claim from the template, which cannot
    # change on a live StatefulSet: 1Gi. The operator grows it, and Ready waits for it.
    play_statefulset_controller(kube, "events")
    wait_for(lambda: pvc_sizes(kube, "events", 3) == ["5Gi"] * 3, message="the new claim grown")
    wait_for(
        lambda: "data-events-2 holds 1Gi" in condition(kube, "events", "Ready").get("message", ""),
        message="Ready=False naming the small volume",
    )
    assert condition(kube, "events", "Ready")["reason"] == "StorageResizing"
    assert status_of(kube, "events")["phase"] != "Ready"
    play_statefulset_controller(kube, "events")  # the resizer finishes
    wait_for(lambda: status_of(kube, "events").get("phase") == "Ready", message="Ready")
    assert capacities(kube, "events", 3) == ["5Gi"] * 3
    assert status_of(kube, "events")["readyReplicas"] == 3


def test_a_server_that_refuses_its_data_format_is_named_in_the_status(kube: Cluster, tmp_path):
    """Issue 15, findings 7 and 8: an older image on a volume a newer server wrote exits at
    start; the status says why (the server's own words), not "Progressing" for ever."""
    # Plain HTTP: the env below is the pod's with only the token file put here.
    plain = {"certificates": {"builtIn": False}}
    _ready(kube, "events", {"replicas": 2, "image": "durable-streams-py:0.2.0", **plain})
    kube.patch(KIND, NS, "events", {"spec": {"image": "durable-streams-py:0.1.0"}})
    sts = wait_for(
        lambda: (
            (s := kube.get("StatefulSet", NS, "events"))["spec"]["template"]["spec"]["containers"][
                0
            ]["image"]
            == "durable-streams-py:0.1.0"
            and s
        ),
        message="the older image rendered",
    )
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The rolled pod's volume holds a format newer than this server writes: the real
    # server, with the pod's settings, refuses it and exits.
    data = tmp_path / "data-events-1"
    data.mkdir()
    newer = WRITE_VERSION + 1
    (data / "FORMAT").write_text(f"durable-streams-py data format {newer}\nread-version 1\n")
    env = container_env(kube, NS, container, "events-1")
    env.update(DS_HOST="127.0.0.1", DS_PORT=str(free_port()), DS_DATA_DIR=str(data))
    (tmp_path / "token").write_text("peer-token\n")  # the mounted Secret, here
    env["DS_REPLICATION_TOKEN_FILE"] = str(tmp_path / "token")
    proc = subprocess.run(
        [sys.executable, "-m", "stream_server", *container["args"]],
        env={**os.environ, **env},
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode != 0
    # The kubelet reports it: CrashLoopBackOff, the end of the log as the message.
    message = termination_message(proc.stdout + proc.stderr)
    pod, pod_status = failed_pod(sts, 1, exit_code=proc.returncode, message=message)
    kube.create(pod).raise_for_status()
    kube.patch("Pod", NS, "events-1", {"status": pod_status}, status=True).raise_for_status()
    rolling = statefulset_status(sts, 2, 1, 1, "events-old", "events-new")
    kube.patch("StatefulSet", NS, "events", {"status": rolling}, status=True).raise_for_status()
    wait_for(
        lambda: condition(kube, "events", "Ready").get("reason") == "CrashLoopBackOff",
        message="Ready=False, CrashLoopBackOff",
    )
    ready = condition(kube, "events", "Ready")
    assert ready["message"].startswith(
        f"pod events-1: the server exited with code {proc.returncode}"
    )
    assert f"data format {newer} is not supported for writing" in ready["message"]
    assert "run a newer server" in ready["message"]
    assert status_of(kube, "events")["phase"] == "Degraded"
    assert condition(kube, "events", "Degraded")["reason"] == "CrashLoopBackOff"


def test_a_real_server_on_a_newer_format_crash_loops_and_the_status_says_why(
    kube: Cluster, tmp_path
):
    """Issue 15, findings 7 and 8, end to end: the kubelet runs the real server on a volume
    a newer server wrote; it exits, is restarted with back-off, and the status says why
    in the server's words. Once the volume is one it knows, the next restart serves."""
    data = tmp_path / "data-events-0"
    data.mkdir()
    newer = WRITE_VERSION + 1
    (data / "FORMAT").write_text(f"durable-streams-py data format {newer}\nread-version 1\n")
    kube.create(durable_stream("events")).raise_for_status()
    wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    with Kubelet(kube, NS, "events", tmp_path, restart_delay=0.5):
        wait_for(
            lambda: condition(kube, "events", "Ready").get("reason") == "CrashLoopBackOff",
            timeout=30,
            message="Ready=False, CrashLoopBackOff",
        )
        message = condition(kube, "events", "Ready")["message"]
        assert message.startswith("pod events-0: the server exited with code 2")
        assert f"data format {newer} is not supported for writing" in message
        assert status_of(kube, "events")["phase"] == "Degraded"
        # The volume is replaced by one this server knows (say, restored from a snapshot).
        (data / "FORMAT").unlink()
        wait_for(
            lambda: status_of(kube, "events").get("phase") == "Ready",
            timeout=40,
            message="Ready once the server starts",
        )


def test_a_server_killed_for_memory_is_named_in_the_status(kube: Cluster):
    """Issue 15, finding 4: an OOM kill (say, while recovery loads many streams) is said."""
    sts = _ready(kube, "events", {"replicas": 1})
    pod, pod_status = failed_pod(sts, 0, exit_code=137, message="", reason="OOMKilled")
    kube.create(pod).raise_for_status()
    kube.patch("Pod", NS, "events-0", {"status": pod_status}, status=True).raise_for_status()
    play_statefulset_controller(kube, "events", ready=0)
    wait_for(
        lambda: condition(kube, "events", "Ready").get("reason") == "OOMKilled",
        message="Ready=False, OOMKilled",
    )
    message = condition(kube, "events", "Ready")["message"]
    assert message.startswith("pod events-0:") and "spec.resources.limits.memory" in message
    assert status_of(kube, "events")["phase"] == "Degraded"
