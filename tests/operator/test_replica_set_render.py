"""Issue 16, part 1: what a replica set renders, refuses and reports (pure functions).

One replica renders what it rendered before replication existed (but for the
ServiceAccount token it no longer mounts); more than one renders the Lease
settings, each pod's identity from the downward API, the pods' own
ServiceAccount/Role/RoleBinding, a primary-only client
Service, a standbys' Service and a PodDisruptionBudget that lets one in-sync pod go
at a time. The rendered settings are given to the real server's settings loader.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from stream_operator.api.spec import min_in_sync, refused_change
from stream_operator.decisions.replica_roles import (
    lease_view,
    refused_scale_down,
    relabel_order,
    wanted_roles,
)
from stream_operator.decisions.status import compute_status
from stream_operator.specs.render import (
    CONTAINER_PORT,
    FENCE_ENV,
    desired_objects,
    render_configmap,
    render_pdb,
    render_replication_secret,
    render_role,
    render_service,
    render_statefulset,
)
from stream_server.config import settings_from
from testkit.pki import PrivateCA

UID = "uid-1"
K8S_VERSION = "1.31"  # as tests/operator/test_chart.py
THREE = {"replicas": 3, "storage": {"size": "1Gi"}}


def kinds(spec: dict[str, Any]) -> list[tuple[str, str]]:
    objs = desired_objects("ev", "ns", UID, spec)
    return [(o["kind"], o["metadata"]["name"]) for o in objs]


def container(spec: dict[str, Any]) -> dict[str, Any]:
    return render_statefulset("ev", "ns", UID, spec)["spec"]["template"]["spec"]["containers"][0]


def test_one_replica_renders_no_trace_of_replication_and_mounts_no_token():
    """The objects, the pod's environment and the client Service of a single server have
    no trace of replication (the config hash is unchanged too: test_render). One change
    since replication came: the pod mounts no ServiceAccount token (issue 25), so the
    operator upgrade that brought it rolled every single server once."""
    one = {"replicas": 1}
    assert kinds(one) == [
        ("ConfigMap", "ev-config"),
        ("Service", "ev-headless"),
        ("Service", "ev"),
        ("PodDisruptionBudget", "ev"),
        ("StatefulSet", "ev"),
        ("NetworkPolicy", "ev"),  # every DurableStream's, on by default (issue 42)
    ]
    assert not any(k.startswith(("DS_REPLICA", "DS_LEASE", "DS_MIN")) for k in env_of(one))
    # The fence file alone (every pod has it: docs/kubernetes.md, Fencing).
    assert container(one)["env"] == [FENCE_ENV]
    pod = render_statefulset("ev", "ns", UID, one)["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod
    assert pod["automountServiceAccountToken"] is False
    three = render_statefulset("ev", "ns", UID, {"replicas": 3})["spec"]["template"]["spec"]
    assert "automountServiceAccountToken" not in three  # its own account's token: the Lease
    assert "streams.pyds.dev/role" not in render_service("ev", "ns", UID, one)["spec"]["selector"]
    assert render_pdb("ev", "ns", UID, one)["spec"]["maxUnavailable"] == 1


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return render_configmap("ev", "ns", UID, spec)["data"]


def test_three_replicas_render_the_lease_settings_and_each_pods_identity():
    spec = {**THREE, "replication": {"durability": "preferred", "leaseDurationSeconds": 20}}
    env = env_of(spec)
    assert env["DS_REPLICATION_LEASE"] == "ns/ev-leader"
    assert env["DS_REPLICATION_SET_SIZE"] == "3"
    assert env["DS_MIN_IN_SYNC"] == "2"  # a majority of three, written out
    assert env["DS_REPLICATION_DURABILITY"] == "preferred"
    assert (env["DS_LEASE_DURATION"], env["DS_LEASE_RENEW_DEADLINE"]) == ("20", "10")
    assert env["DS_LEASE_RETRY_PERIOD"] == "2"
    # Pod 0 alone starts the set from empty storage; a pod with data always may, so a
    # single server scaled up keeps its data (docs/replication.md, "A set's identity").
    assert env["DS_REPLICATION_BOOTSTRAP"] == "ev-0"
    ident = container(spec)["env"]
    assert ident[0] == {
        "name": "POD_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    values = {e["name"]: e.get("value") for e in ident}
    assert values["DS_REPLICA_NAME"] == "$(POD_NAME)"
    assert values["DS_REPLICA_URL"] == f"http://$(POD_NAME).ev-headless.ns.svc:{CONTAINER_PORT}"
    tls = {**THREE, "server": {"tlsSecretName": "ev-tls"}}
    tls_url = {e["name"]: e.get("value") for e in container(tls)["env"]}["DS_REPLICA_URL"]
    assert tls_url.startswith("https://")


def expanded(spec: dict[str, Any], pod: str) -> dict[str, str]:
    """The pod's environment as the kubelet builds it: the ConfigMap, then ``env`` with
    ``$(POD_NAME)`` expanded."""
    env = dict(env_of(spec))
    for entry in container(spec)["env"]:
        env[entry["name"]] = entry.get("value", pod).replace("$(POD_NAME)", pod)
    return env


@pytest.mark.parametrize("replicas", [2, 3, 5])
def test_the_server_accepts_the_rendered_replica_set_settings(replicas: int, tmp_path: Path):
    """The real settings loader, with its unknown-variable and consistency checks; the
    peer token file is where the Secret is mounted (here a file of the test's)."""
    spec = {**THREE, "replicas": replicas}
    env = expanded(spec, "ev-1")
    mount = container(spec)["volumeMounts"][-1]["mountPath"]
    assert env["DS_REPLICATION_TOKEN_FILE"] == f"{mount}/token"
    (tmp_path / "token").write_text("s3cret\n")
    env["DS_REPLICATION_TOKEN_FILE"] = str(tmp_path / "token")
    s = settings_from(argparse.Namespace(), env)
    assert s.replication_lease == "ns/ev-leader" and s.replica_name == "ev-1"
    assert s.replica_url == "http://ev-1.ev-headless.ns.svc:4437"
    assert s.replication_bootstrap == "ev-0"
    assert s.replication_pod == "ev-1"  # the pod it labels: its own
    assert s.replication_set_size == replicas and s.min_in_sync == replicas // 2 + 1


def test_a_replica_set_over_tls_checks_its_peers_against_the_secrets_ca(tmp_path: Path):
    """With a TLS Secret the peers' https certificates come from its issuer, a private CA
    the system store lacks: its ``ca.crt`` (cert-manager writes it into the Secret, which
    is mounted whole) becomes the set's CA file. One replica, or no TLS: no such setting.
    The real settings loader takes it, given a real CA file where the Secret is mounted."""
    spec = {**THREE, "server": {"tlsSecretName": "ev-tls"}}
    env = expanded(spec, "ev-0")
    mounts = {m["name"]: m["mountPath"] for m in container(spec)["volumeMounts"]}
    assert env["DS_REPLICATION_CA_FILE"] == f"{mounts['tls']}/ca.crt"
    assert env["DS_TLS_CERT"] == f"{mounts['tls']}/tls.crt"
    assert "DS_REPLICATION_CA_FILE" not in env_of({"replicas": 1, "server": spec["server"]})
    assert "DS_REPLICATION_CA_FILE" not in env_of(THREE)
    ca = PrivateCA(tmp_path / "ca")
    served = ca.issue("tls", "ev-0.ev-headless.ns.svc")
    (tmp_path / "token").write_text("s3cret\n")
    env |= {
        "DS_REPLICATION_CA_FILE": str(ca.cert),
        "DS_TLS_CERT": str(served.cert),
        "DS_TLS_KEY": str(served.key),
        "DS_REPLICATION_TOKEN_FILE": str(tmp_path / "token"),
    }
    s = settings_from(argparse.Namespace(), env)
    assert s.replica_url == "https://ev-0.ev-headless.ns.svc:4437"
    assert s.replication_ca_file == str(ca.cert)


def test_a_replica_set_mounts_its_peer_token_and_leaves_its_pods_to_the_operator():
    """The Secret (made once by the operator, not part of desired_objects) is mounted
    read-only, and the StatefulSet's controller replaces no pod by itself (OnDelete: the
    operator updates standbys first and switches over before the primary, rollout.py)."""
    sts = render_statefulset("ev", "ns", UID, THREE)
    pod = sts["spec"]["template"]["spec"]
    assert {
        "name": "replication",
        "secret": {"secretName": "ev-replication", "defaultMode": 0o440},
    } in pod["volumes"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["replication"] == {
        "name": "replication",
        "mountPath": "/etc/durable-streams/replication",
        "readOnly": True,
    }
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "Secret" not in {kind for kind, _ in kinds(THREE)}  # never applied, never pruned
    one = render_statefulset("ev", "ns", UID, {"replicas": 1})
    assert one["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert "replication" not in {v["name"] for v in one["spec"]["template"]["spec"]["volumes"]}
    assert "DS_REPLICATION_TOKEN_FILE" not in env_of({"replicas": 1})
    secret = render_replication_secret("ev", "ns", UID, "tok-en")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert base64.b64decode(secret["data"]["token"]) == b"tok-en"
    kubernetes_validate.validate(secret, K8S_VERSION, strict=True)


def test_the_pods_rights_are_their_lease_and_their_pods_by_name_and_nothing_cluster_wide():
    assert kinds(THREE) == [
        ("ConfigMap", "ev-config"),
        ("ServiceAccount", "ev"),
        ("Role", "ev"),
        ("RoleBinding", "ev"),
        ("Service", "ev-headless"),
        ("Service", "ev"),
        ("Service", "ev-replicas"),
        ("PodDisruptionBudget", "ev"),
        ("StatefulSet", "ev"),
        ("NetworkPolicy", "ev"),
    ]
    rules = render_role("ev", "ns", UID, THREE)["rules"]
    by_name = [r for r in rules if r.get("resourceNames")]
    assert by_name == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["ev-leader"],
            "verbs": ["get", "update", "watch"],
        },
        # Their own set's pods, every ordinal a set can have: the holder labels them and
        # sets their in-sync condition (stream_server.replication.lease.pod_labels).
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": [f"ev-{i}" for i in range(5)],
            "verbs": ["get", "patch"],
        },
        {
            "apiGroups": [""],
            "resources": ["pods/status"],
            "resourceNames": [f"ev-{i}" for i in range(5)],
            "verbs": ["patch"],
        },
    ]
    # create cannot be limited by name in Kubernetes: the one verb granted without it.
    assert [r["verbs"] for r in rules if not r.get("resourceNames")] == [["create"]]
    pod = render_statefulset("ev", "ns", UID, THREE)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ev"
    # Ready only while in sync: the gate whose condition the Lease holder sets.
    assert pod["readinessGates"] == [{"conditionType": "streams.pyds.dev/in-sync"}]
    one = render_statefulset("ev", "ns", UID, {"replicas": 1})["spec"]["template"]["spec"]
    assert "readinessGates" not in one


def test_services_route_the_primary_and_the_standbys_apart():
    objs = desired_objects("ev", "ns", UID, THREE)
    svc = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert svc["ev"]["spec"]["selector"]["streams.pyds.dev/role"] == "primary"
    assert svc["ev-replicas"]["spec"]["selector"]["streams.pyds.dev/role"] == "standby"
    assert "streams.pyds.dev/role" not in svc["ev-headless"]["spec"]["selector"]
    # Each Service says which it is (component), for users' own monitors and tools.
    assert svc["ev-replicas"]["metadata"]["labels"]["app.kubernetes.io/component"] == "replicas"


def test_the_disruption_budget_lets_one_pod_go_at_a_time():
    """(The rule for every setting: test_disruptions.)"""
    assert render_pdb("ev", "ns", UID, THREE)["spec"] == {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "durable-streams",
                "app.kubernetes.io/instance": "ev",
            }
        },
    }
    pinned = {**THREE, "replicas": 5, "replication": {"minInSync": 4}}
    assert render_pdb("ev", "ns", UID, pinned)["spec"]["maxUnavailable"] == 1
    assert min_in_sync(pinned) == 4


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"replicas": 6}, "replicas must be 1 to 5"),
        ({"replicas": 2, "replication": {"minInSync": 3}}, "minInSync (3) is more than replicas"),
        ({"replicas": 3, "replication": {"durability": "maybe"}}, "durability"),
        ({"replication": {"renewDeadlineSeconds": 15}}, "renewDeadlineSeconds must be less"),
        ({"replication": {"retryPeriodSeconds": 10}}, "retryPeriodSeconds must be less"),
        ({"replication": {"readStalenessSeconds": 2}}, "readStalenessSeconds (2) must be more"),
    ],
)
def test_settings_the_server_would_refuse_are_refused(spec: dict[str, Any], words: str):
    assert words in (refused_change(None, spec) or "")


def test_a_scale_down_below_the_in_sync_count_is_refused_with_the_reason():
    old = {"replicas": 3, "replication": {"minInSync": 3}}
    why = refused_change(old, {**old, "replicas": 2})
    assert why is not None and "lower minInSync before scaling down" in why
    assert refused_change(old, {"replicas": 2, "replication": {"minInSync": 2}}) is None


def lease(holder: str, in_sync: list[str], term: int = 3) -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {
                "streams.pyds.dev/term": str(term),
                "streams.pyds.dev/in-sync": json.dumps(in_sync),
                "streams.pyds.dev/positions": json.dumps({"ev-0": [3, 120], "ev-2": [3, 117]}),
            }
        },
        "spec": {"holderIdentity": holder},
    }


def pod(name: str, role: str | None = None) -> dict[str, Any]:
    labels = {"streams.pyds.dev/role": role} if role else {}
    return {"metadata": {"name": name, "labels": labels}}


def test_relabelling_demotes_before_it_promotes():
    """A failover ev-0 -> ev-2: ev-0 loses the primary label before ev-2 gets it, so the
    primary Service never selects two pods."""
    pods = [pod("ev-0", "primary"), pod("ev-1", "standby"), pod("ev-2", "standby")]
    wanted = wanted_roles(lease_view(lease("ev-2", ["ev-1"])), pods)
    current = {"ev-0": "primary", "ev-1": "standby", "ev-2": "standby"}
    assert relabel_order(current, wanted) == [("ev-0", "standby"), ("ev-2", "primary")]
    assert relabel_order({**current, "ev-0": "standby", "ev-2": "primary"}, wanted) == []
    # No Lease yet: nobody is primary.
    assert set(wanted_roles(lease_view(None), pods).values()) == {"standby"}


def ready_sts() -> dict[str, Any]:
    st = {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "observedGeneration": 1}
    return {"metadata": {"generation": 1}, "status": st}


def conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_status_names_the_primary_term_and_each_replicas_role():
    pods = [pod("ev-0"), pod("ev-1"), pod("ev-2")]
    s = compute_status(
        spec=THREE,
        generation=1,
        statefulset=ready_sts(),
        endpoint="e",
        pods=pods,
        lease=lease("ev-0", ["ev-2"]),
    )
    assert (s["primary"], s["term"], s["inSyncReplicas"]) == ("ev-0", 3, 2)
    assert s["replicaStatus"] == [
        {"name": "ev-0", "role": "primary", "inSync": True, "position": [3, 120], "lagBatches": 0},
        {"name": "ev-1", "role": "standby", "inSync": False},  # never reported a position
        {"name": "ev-2", "role": "standby", "inSync": True, "position": [3, 117], "lagBatches": 3},
    ]
    assert conds(s)["Degraded"] == ("False", "AsExpected")


def test_fewer_in_sync_than_asked_is_degraded_with_the_counts():
    pods = [pod("ev-0"), pod("ev-1"), pod("ev-2")]
    s = compute_status(
        spec={**THREE, "replication": {"minInSync": 3}},
        generation=1,
        statefulset=ready_sts(),
        endpoint="e",
        pods=pods,
        lease=lease("ev-0", ["ev-2"]),
    )
    assert conds(s)["Degraded"] == ("True", "TooFewInSync")
    message = next(c["message"] for c in s["conditions"] if c["type"] == "Degraded")
    assert message == "2 replica(s) in sync (ev-0), minInSync is 3"
    none = compute_status(
        spec=THREE, generation=1, statefulset=ready_sts(), endpoint="e", pods=pods, lease=None
    )
    assert conds(none)["Degraded"] == ("True", "TooFewInSync") and none["primary"] == ""


@pytest.mark.parametrize("replicas", [1, 3])
def test_every_rendered_object_validates_against_the_kubernetes_schemas(replicas: int):
    """Strict (unknown fields refused): a misspelt field in the Role or the env would
    otherwise only show on a real cluster."""
    spec = {**THREE, "replicas": replicas, "server": {"tlsSecretName": "ev-tls"}}
    for obj in desired_objects("ev", "ns", UID, spec):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_scale_down_waits_while_it_would_remove_the_primary_or_leave_a_lagging_pod():
    on_two = lease_view(lease("ev-2", ["ev-0"]))
    why = refused_scale_down("ev", 3, 2, on_two)
    assert why is not None and "would remove the primary ev-2: delete pod ev-2 first" in why
    on_zero = lease_view(lease("ev-0", ["ev-2"]))
    assert refused_scale_down("ev", 3, 2, on_zero) is None  # ev-2 is a standby
    assert refused_scale_down("ev", 3, 1, on_zero) is None  # ev-0 holds every write
    on_one = lease_view(lease("ev-1", ["ev-2"]))
    assert refused_scale_down("ev", 3, 2, on_one) is None
    lagging = refused_scale_down("ev", 2, 1, lease_view(lease("ev-1", [])))
    assert lagging is not None and "would remove the primary ev-1" in lagging
    alone = refused_scale_down("ev", 2, 1, lease_view(lease("", [])))
    assert alone is not None and "ev-0 serving alone, and it is not in sync" in alone
    assert refused_scale_down("ev", 3, 5, on_two) is None  # growth


def test_read_staleness_reaches_the_pods_only_when_set():
    """Left out, the server's default holds and the config (so the pods) stay as they were."""
    env = render_configmap("ev", "ns", UID, THREE)["data"]
    assert "DS_REPLICATION_READ_STALENESS" not in env
    spec = {**THREE, "replication": {"readStalenessSeconds": 12}}
    assert render_configmap("ev", "ns", UID, spec)["data"]["DS_REPLICATION_READ_STALENESS"] == "12"
    assert refused_change(None, spec) is None
