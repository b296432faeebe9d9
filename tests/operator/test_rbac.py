"""Issue 15, finding 9: the operator's RBAC, and what it leaves behind when it is gone.

The real kopf operator runs against the emulated API server through a
scenario that makes it use everything it may do (create, grow, prune, delete
with each retention), cluster-wide and watching two namespaces; the RBAC the
chart renders for that mode must grant every request it made and nothing it
did not make. Then: a DurableStream that keeps its volumes has no finalizer,
so it can be deleted with no operator running (after ``helm uninstall``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_operator import KIND
from stream_operator.specs.render import render_role
from testkit import free_port, rbac, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import Call, durable_stream
from testkit.leases import replica_lease
from testkit.operator import running_operator
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "durable-streams"
sys.path.insert(0, str(ROOT / "scripts"))

from get_tools import ensure  # noqa: E402

pytestmark = pytest.mark.processes

RELEASE_NS = "ops"
ACCOUNT = "rel-durable-streams"
ANALYTICS = {
    "enabled": True,
    "schedule": "@daily",
    "output": {"claimName": "analytics-out"},
    "jobs": [{"name": "stats", "type": "stream-stats"}],
}


def chart_rbac(*sets: str) -> list[dict[str, Any]]:
    args = [str(ensure() / "helm"), "template", "rel", str(CHART), "--namespace", RELEASE_NS]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    kinds = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] in kinds]


def play_statefulset_controller(c: Cluster, namespace: str, name: str) -> None:
    sts = c.get("StatefulSet", namespace, name)
    want = sts["spec"]["replicas"]
    claim_volumes(c, sts)
    rev = f"{name}-{sts['metadata']['generation']}"
    status = statefulset_status(sts, want, want, want, rev, rev)
    c.patch("StatefulSet", namespace, name, {"status": status}, status=True).raise_for_status()


def phase(c: Cluster, namespace: str, name: str) -> str | None:
    return ((c.get(KIND, namespace, name) or {}).get("status") or {}).get("phase")


def role(c: Cluster, namespace: str, pod: str) -> str | None:
    labels = (c.get("Pod", namespace, pod) or {}).get("metadata", {}).get("labels") or {}
    return labels.get("streams.pyds.dev/role")


def become_a_replica_set_and_back(c: Cluster, namespace: str) -> None:
    """Three replicas (the pods' account, Role, RoleBinding, peer token Secret, the
    standbys' Service, the role labels from the Lease, a standby's pod deleted to update
    it), then one again (all of that pruned but the Secret, which goes with the owner)."""
    c.patch(KIND, namespace, "events", {"spec": {"replicas": 3}}).raise_for_status()
    wait_for(lambda: c.get("RoleBinding", namespace, "events"), message="the RoleBinding")
    wait_for(
        lambda: c.get("StatefulSet", namespace, "events")["spec"]["replicas"] == 3,
        message="three replicas",
    )
    sts = c.get("StatefulSet", namespace, "events")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    for i in range(3):
        pod = pod_object(sts, i)
        # Pods of an older revision than the StatefulSet's: the rolling update deletes one.
        pod["metadata"]["labels"]["controller-revision-hash"] = "events-old"
        c.create(pod).raise_for_status()
        ready = {"status": pod_status(container, ready=True, restarts=0)}
        c.patch("Pod", namespace, f"events-{i}", ready, status=True).raise_for_status()
    lease = replica_lease("events", namespace, "events-0", 1, ["events-1", "events-2"])
    c.create(lease).raise_for_status()
    play_statefulset_controller(c, namespace, "events")
    wait_for(lambda: role(c, namespace, "events-0") == "primary", message="the primary label")
    wait_for(lambda: c.get("Pod", namespace, "events-2") is None, message="a standby updated")
    c.patch(KIND, namespace, "events", {"spec": {"replicas": 1}}).raise_for_status()
    # The StatefulSet asks for one pod first, its template still the set's; its controller
    # then removes pods 1.. and the operator applies the single-node objects (scaling.py).
    wait_for(
        lambda: c.get("StatefulSet", namespace, "events")["spec"]["replicas"] == 1,
        message="one replica asked for",
    )
    for i in (1, 2):
        if c.get("Pod", namespace, f"events-{i}") is not None:
            c.delete("Pod", namespace, f"events-{i}")
    wait_for(lambda: c.get("RoleBinding", namespace, "events") is None, message="pruned RBAC")
    wait_for(lambda: c.get("Service", namespace, "events-replicas") is None, message="pruned")
    c.delete("Pod", namespace, "events-0").raise_for_status()
    play_statefulset_controller(c, namespace, "events")


def everything_the_operator_does(c: Cluster, namespace: str) -> None:
    """Create with every optional part, grow, turn parts off (prune), delete (PVCs go)."""
    c.install_podmonitor_crd()
    c.install_certificate_crd()
    c.install_spark_operator_crd()
    spec = {
        "storage": {"size": "1Gi", "pvcRetention": "Delete"},
        "metrics": {"podMonitor": {"enabled": True}},
        "certificates": {"issuerRef": {"name": "ca"}},
        "analytics": ANALYTICS,
        "backup": {
            "objectStore": {"destinationPath": "s3://bucket/events"},
            "schedule": "* * * * * *",
        },
    }
    c.create(durable_stream("events", spec, namespace)).raise_for_status()
    wait_for(lambda: c.get("StatefulSet", namespace, "events"), message="the StatefulSet")
    wait_for(lambda: c.get("Certificate", namespace, "events-tls"), message="the Certificate")
    play_statefulset_controller(c, namespace, "events")
    wait_for(lambda: phase(c, namespace, "events") == "Ready", message="Ready")
    wait_for(lambda: c.list("ScheduledSparkApplication", namespace), message="a Spark job")
    # The schedule (every second) makes a DurableStreamBackup, which the operator takes:
    # the pods answer nothing here (the archive's own tests are test_backup_kopf.py).
    wait_for(
        lambda: any(
            (b.get("status") or {}).get("phase") == "failed"
            for b in c.list("DurableStreamBackup", namespace)
        ),
        message="a scheduled backup taken (and failed: no server answers)",
    )
    become_a_replica_set_and_back(c, namespace)
    off = {
        "storage": {"size": "2Gi"},
        "metrics": {"podMonitor": {"enabled": False}},
        "certificates": None,
        "analytics": {"enabled": False},
        "backup": None,
        "networkPolicy": {"enabled": False},
    }
    c.patch(KIND, namespace, "events", {"spec": off}).raise_for_status()
    wait_for(lambda: c.get("NetworkPolicy", namespace, "events") is None, message="pruned")
    wait_for(lambda: c.get("PodMonitor", namespace, "events") is None, message="pruned")
    wait_for(lambda: c.get("Certificate", namespace, "events-tls") is None, message="pruned")
    wait_for(lambda: not c.list("ScheduledSparkApplication", namespace), message="unscheduled")
    wait_for(
        lambda: (
            c.get("PersistentVolumeClaim", namespace, "data-events-0")["spec"]["resources"][
                "requests"
            ]["storage"]
            == "2Gi"
        ),
        message="the claim grown",
    )
    c.delete(KIND, namespace, "events").raise_for_status()
    wait_for(lambda: c.get(KIND, namespace, "events") is None, message="deleted")
    wait_for(lambda: not c.list("PersistentVolumeClaim", namespace), message="the claims gone")


@pytest.mark.parametrize(
    ("watched", "sets"),
    [((), ("operator.clusterWide=true",)), (("a", "b"), ("operator.watchNamespaces={a,b}",))],
    ids=["cluster-wide", "namespaced"],
)
def test_rbac_grants_exactly_what_the_operator_uses(watched: tuple[str, ...], sets: tuple):
    docs = chart_rbac(*sets)
    from stream_operator.controllers import replica_set

    nobody = f"http://127.0.0.1:{free_port()}"  # the pods' servers: nothing listens
    replica_set.use_pod_urls(lambda *_: nobody)
    with cluster() as c:
        with running_operator(c, watched):
            # Not watched in the namespaced mode: the operator must leave it alone.
            c.create(durable_stream("other", {}, "c")).raise_for_status()
            everything_the_operator_does(c, "a")
        untouched = c.get("StatefulSet", "c", "other") is None
    replica_set.use_pod_urls(None)
    calls = [call for call in c.api.requests if not call.agent.startswith("python-httpx/")]
    granted = rbac.grants(docs, ACCOUNT, RELEASE_NS)
    # The Lease is the leader election's (tests/operator/test_leader_election.py).
    lease = {g for g in granted if g.resource == "leases"}
    # What the operator holds only to grant it to a replica set's servers (their Role,
    # render_role): Kubernetes refuses a Role that grants more than its creator holds.
    pods_role = render_role("events", "a", "uid", {"replicas": 3})["rules"]
    for_servers = {
        g
        for g in granted
        if any(
            g.group in r["apiGroups"] and g.resource in r["resources"] and g.verb in r["verbs"]
            for r in pods_role
        )
    }
    assert (
        rbac.denied(
            [
                Call(verb, group, resource, "server", "a")
                for r in pods_role
                for group in r["apiGroups"]
                for resource in r["resources"]
                for verb in r["verbs"]
            ],
            granted,
        )
        == []
    ), "the operator must hold every right it grants the servers"
    # The scenario runs in "a"; "b" has the same Role (checked below).
    # Replacing a Secret: the built-in CA's renewals (test_builtin_tls_kopf.py needs it).
    renewals = {g for g in granted if (g.verb, g.resource) == ("update", "secrets")}
    in_a = {g for g in granted - lease - for_servers - renewals if g.namespace in (None, "a")}
    assert rbac.denied(calls, granted) == []
    assert rbac.unused(calls, in_a) == []
    # Its own use of one of them: the in-sync condition set from the Lease (a backstop).
    assert ("patch", "pods/status") in {(c.verb, c.resource) for c in calls}
    # The Lease's rights are the leader election's too (test_leader_election.py): the
    # owner reference added to a replica set's Lease (lease_owner.py) asks these.
    made = {(c.verb, c.resource, c.name) for c in calls}
    assert {("patch", "leases", "events-leader"), ("delete", "leases", "events-leader")} <= made
    if watched:
        per_ns = {
            ns: {(g.verb, g.group, g.resource) for g in granted if g.namespace == ns}
            for ns in watched
        }
        assert per_ns["a"] == per_ns["b"]
        assert {call.namespace for call in calls} <= {None, *watched}
        assert {g.namespace for g in granted} == {None, RELEASE_NS, *watched}
        # Cluster-wide, only reads of CRDs and StorageClasses by name.
        assert {(g.verb, g.resource) for g in granted if g.namespace is None} == {
            ("get", "customresourcedefinitions"),
            ("get", "storageclasses"),
        }
        assert "ClusterRole" in {d["kind"] for d in docs}
        assert untouched
    else:
        assert {g.namespace for g in granted} == {None, RELEASE_NS}


NAMESPACED = {"secrets", "leases", "roles", "rolebindings", "pods", "serviceaccounts"}


def test_the_default_rbac_is_namespaced_to_the_release():
    """Issue 42: by default nothing outside the release's namespace (kube-system's Secrets
    and Leases, Roles anywhere) and only CRDs and StorageClasses read cluster-wide."""
    granted = rbac.grants(chart_rbac(), ACCOUNT, RELEASE_NS)
    assert {g.namespace for g in granted} == {None, RELEASE_NS}
    assert {(g.verb, g.resource) for g in granted if g.namespace is None} == {
        ("get", "customresourcedefinitions"),
        ("get", "storageclasses"),
    }
    assert {g.resource for g in granted if g.namespace == RELEASE_NS} >= NAMESPACED
    # The operator's own Lease is read and renewed by name (create cannot be named).
    own = {(g.verb, g.name) for g in granted if g.resource == "leases" and g.name}
    assert own == {("get", "rel-durable-streams"), ("update", "rel-durable-streams")}
    deployment = chart_docs()
    assert "--namespace=ops" in deployment[0]["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(
    "sets",
    [(), ("operator.clusterWide=true",), ("operator.watchNamespaces={a,b}",)],
    ids=["default", "cluster-wide", "namespaced"],
)
def test_no_rbac_mode_can_escalate(sets: tuple[str, ...]):
    """Kubernetes lets the operator write the servers' Role only with rights it holds:
    bind, escalate or impersonate would lift that limit."""
    rules = [r for d in chart_rbac(*sets) if "rules" in d for r in d["rules"]]
    verbs = {v for r in rules for v in r["verbs"]}
    assert not verbs & {"bind", "escalate", "impersonate", "*"}


def test_cluster_wide_and_listed_namespaces_are_refused():
    args = [str(ensure() / "helm"), "template", "rel", str(CHART), "--namespace", RELEASE_NS]
    args += ["--set", "operator.clusterWide=true", "--set", "operator.watchNamespaces={a}"]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "operator.clusterWide and operator.watchNamespaces" in proc.stderr


def chart_docs(*sets: str) -> list[dict[str, Any]]:
    """The Deployment(s) the chart renders with ``sets``."""
    args = [str(ensure() / "helm"), "template", "rel", str(CHART), "--namespace", RELEASE_NS]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]


def finalizers(c: Cluster, name: str) -> list[str]:
    return (c.get(KIND, "default", name) or {}).get("metadata", {}).get("finalizers") or []


def test_a_retained_durable_stream_deletes_with_no_operator_running():
    """Before: every DurableStream had kopf's finalizer, so after ``helm uninstall`` a
    ``kubectl delete`` of one hung for ever (nobody left to remove it)."""
    with cluster() as c:
        with running_operator(c):
            spec = {"replicas": 2, "storage": {"pvcRetention": "Retain"}}
            c.create(durable_stream("kept", spec)).raise_for_status()
            c.create(durable_stream("gone", {"storage": {"pvcRetention": "Delete"}}))
            for name in ("kept", "gone"):
                wait_for(lambda n=name: c.get("StatefulSet", "default", n), message=name)
                play_statefulset_controller(c, "default", name)
                wait_for(lambda n=name: phase(c, "default", n) == "Ready", message="Ready")
            # The operator's handlers and timers ran on both; only "gone" must wait for it.
            wait_for(lambda: finalizers(c, "gone"), message="the finalizer on gone")
            assert finalizers(c, "kept") == []
        # The operator is gone (uninstalled).
        c.delete(KIND, "default", "kept").raise_for_status()
        assert c.get(KIND, "default", "kept") is None
        claims = {p["metadata"]["name"] for p in c.list("PersistentVolumeClaim", "default")}
        assert {"data-kept-0", "data-kept-1"} <= claims  # the data stays
        # "gone" waits for an operator to delete its claims, and gets them deleted.
        c.delete(KIND, "default", "gone").raise_for_status()
        assert c.get(KIND, "default", "gone")["metadata"]["deletionTimestamp"]
        with running_operator(c):
            wait_for(lambda: c.get(KIND, "default", "gone") is None, message="gone deleted")
            claims = {p["metadata"]["name"] for p in c.list("PersistentVolumeClaim", "default")}
            assert "data-gone-0" not in claims


def test_the_finalizer_follows_the_retention_setting():
    with cluster() as c, running_operator(c):
        c.create(durable_stream("events", {"storage": {"pvcRetention": "Delete"}}))
        wait_for(lambda: finalizers(c, "events"), message="a finalizer with Delete")
        keep = {"spec": {"storage": {"pvcRetention": "Retain"}}}
        c.patch(KIND, "default", "events", keep).raise_for_status()
        wait_for(lambda: finalizers(c, "events") == [], message="no finalizer with Retain")
