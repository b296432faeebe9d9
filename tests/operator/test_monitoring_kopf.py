"""Issue 25: the PodMonitor and the cert-manager Certificate, under the real kopf operator.

The operator runs against the emulated API server (testkit.kube) with the Prometheus
Operator's PodMonitor CRD and cert-manager's Certificate CRD installed from their
published schemas (tests/operator/crds/README.md), so every object it renders is
validated as those projects' API servers would validate it. Pods are made by hand as
the StatefulSet controller makes them; the role labels come from the operator, which
follows the Lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.leases import replica_lease
from testkit.operator_rbac import operated_cluster
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

pytestmark = pytest.mark.slow

NS = "default"


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with operated_cluster() as c:
        yield c


def conditions(c: Cluster, name: str) -> dict[str, dict[str, Any]]:
    status = (c.get(KIND, NS, name) or {}).get("status") or {}
    return {x["type"]: x for x in status.get("conditions") or []}


def pods_of_a_replica_set(c: Cluster, name: str, replicas: int) -> None:
    """The StatefulSet controller's pods, ready, and the servers' Lease: ``<name>-0``
    holds it."""
    sts = wait_for(lambda: c.get("StatefulSet", NS, name), message="the StatefulSet")
    claim_volumes(c, sts)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    for i in range(replicas):
        c.create(pod_object(sts, i)).raise_for_status()
        ready = {"status": pod_status(container, ready=True, restarts=0)}
        c.patch("Pod", NS, f"{name}-{i}", ready, status=True).raise_for_status()
    standbys = [f"{name}-{i}" for i in range(1, replicas)]
    c.create(replica_lease(name, NS, f"{name}-0", 1, standbys)).raise_for_status()
    rev = f"{name}-{sts['metadata']['generation']}"
    status = statefulset_status(sts, replicas, replicas, replicas, rev, rev)
    c.patch("StatefulSet", NS, name, {"status": status}, status=True).raise_for_status()


def selected(c: Cluster, match: dict[str, str]) -> list[str]:
    """The pods a label selector (matchLabels) selects, by name."""
    return sorted(
        p["metadata"]["name"]
        for p in c.list("Pod", NS)
        if match.items() <= (p["metadata"].get("labels") or {}).items()
    )


def test_a_podmonitor_selects_every_pod_where_the_client_service_selects_the_primary(
    kube: Cluster,
):
    """A monitor of the client Service (what a ServiceMonitor was) scrapes one pod of
    three, the primary; the PodMonitor selects all three."""
    kube.install_podmonitor_crd()
    spec = {"replicas": 3, "metrics": {"podMonitor": {"enabled": True, "interval": "10s"}}}
    kube.create(durable_stream("events", spec)).raise_for_status()
    pods_of_a_replica_set(kube, "events", 3)
    monitor = wait_for(lambda: kube.get("PodMonitor", NS, "events"), message="the PodMonitor")
    owner = kube.get(KIND, NS, "events")["metadata"]["uid"]
    assert [r["uid"] for r in monitor["metadata"]["ownerReferences"]] == [owner]
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "10s"
    # What each reaches, once the operator has labelled the pods from the Lease.
    wait_for(
        lambda: selected(kube, {"streams.pyds.dev/role": "standby"}) == ["events-1", "events-2"],
        message="role labels",
    )
    client = kube.get("Service", NS, "events")["spec"]["selector"]
    assert selected(kube, client) == ["events-0"]  # all a ServiceMonitor reached
    assert selected(kube, monitor["spec"]["selector"]["matchLabels"]) == [
        "events-0",
        "events-1",
        "events-2",
    ]


def test_an_issuer_gets_a_certificate_for_every_name_and_the_pods_serve_it(kube: Cluster):
    spec = {"replicas": 3, "certificates": {"issuerRef": {"name": "private-ca"}}}
    kube.create(durable_stream("events", spec)).raise_for_status()
    # No cert-manager: nothing is made, and the status says so.
    missing = wait_for(
        lambda: (cond := conditions(kube, "events").get("Certificates")) and cond,
        message="the Certificates condition",
    )
    assert (missing["status"], missing["reason"]) == ("False", "CertManagerMissing")
    sts = kube.get("StatefulSet", NS, "events")
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    # 420 (0644): the API server's default mode for a secret volume.
    tls = {"name": "tls", "secret": {"secretName": "events-tls", "defaultMode": 420}}
    assert tls in volumes
    # cert-manager installed: the next resync makes the Certificate.
    kube.install_certificate_crd()
    cert = wait_for(lambda: kube.get("Certificate", NS, "events-tls"), message="Certificate")
    wait_for(
        lambda: conditions(kube, "events").get("Certificates", {}).get("status") == "True",
        message="Certificates=True",
    )
    body = cert["spec"]
    assert body["secretName"] == "events-tls"
    assert body["issuerRef"] == {"name": "private-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert "events.default.svc" in body["dnsNames"]
    assert "events-2.events-headless.default.svc" in body["dnsNames"]
    owner = kube.get(KIND, NS, "events")["metadata"]["uid"]
    assert [r["uid"] for r in cert["metadata"]["ownerReferences"]] == [owner]
    # Scaled up: the new pod's name is in the Certificate too.
    kube.patch(KIND, NS, "events", {"spec": {"replicas": 4}}).raise_for_status()
    wait_for(
        lambda: (
            "events-3.events-headless.default.svc"
            in kube.get("Certificate", NS, "events-tls")["spec"]["dnsNames"]
        ),
        message="the fourth pod's name",
    )
    # The issuer removed: the Certificate goes, the condition too.
    kube.patch(KIND, NS, "events", {"spec": {"certificates": None}}).raise_for_status()
    wait_for(lambda: kube.get("Certificate", NS, "events-tls") is None, message="pruned")
    wait_for(lambda: "Certificates" not in conditions(kube, "events"), message="no condition")


def test_an_issuer_and_a_named_secret_are_refused_together(kube: Cluster):
    kube.install_certificate_crd()
    both = {"server": {"tlsSecretName": "mine"}, "certificates": {"issuerRef": {"name": "ca"}}}
    assert kube.create(durable_stream("events", both)).status_code == 422  # the CRD's rule
    kube.serve_crd_without_rules()  # a cluster whose CRD has none: the operator refuses
    kube.create(durable_stream("events", both)).raise_for_status()
    accepted = wait_for(
        lambda: (cond := conditions(kube, "events").get("Accepted")) and cond,
        message="Accepted",
    )
    assert accepted["status"] == "False" and accepted["reason"] == "ChangeRefused"
    assert "both" in accepted["message"]
    assert kube.get("Certificate", NS, "events-tls") is None
    assert kube.get("StatefulSet", NS, "events") is None
