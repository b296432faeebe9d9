"""Issue 25: a real Prometheus scrapes every pod of a 3-replica set through the operator's
PodMonitor, over TLS with the certificate the operator asked cert-manager for.

Everything the operator makes is real here: kopf runs the handlers against the emulated
API server (with the PodMonitor and Certificate CRDs, published schemas), the kubelet
stand-in runs the StatefulSet's three pods as real server processes that elect their
primary through the Lease, and:

* cert-manager's CA issuer is played by testkit.cert_manager: the Secret it writes holds
  a certificate for exactly the Certificate's ``dnsNames`` (``tls.crt``, ``tls.key``,
  ``ca.crt``), which every pod serves; peers reach each other by their pod names
  (``ds-N.ds-headless.default.svc``, resolved by testkit.hosts as cluster DNS would), so
  the standbys check the primary's certificate against the CA and those names;
* the PodMonitor becomes a scrape job as the Prometheus Operator writes it
  (testkit.prometheus_operator: the pod role, its selector, port and jobLabel
  relabelling, the CA from the Secret, the server name), discovery answering what the
  pod role would (testkit.pod_discovery). A pod of another component in the namespace
  is discovered and dropped by the selector.

What is checked: ``up{job="durable-streams"}`` is 1 for each of the three pods (the
primary and both standbys), each with its ``pod``, ``instance`` and ``namespace``; the
series the alerts read exist for each pod; and a standby's nearly full volume (a 16 MiB
tmpfs) makes DurableStreamsDiskNearlyFull go pending for that standby. Before, the
ServiceMonitor selected the client Service, which selects the primary: the test shows
that Service's selector picks one pod of the three.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator import KIND
from testkit import cert_manager, hosts, needs, pod_discovery, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.operator import running_operator
from testkit.pki import PrivateCA
from testkit.prometheus import Prometheus
from testkit.prometheus_operator import scrape_configs

pytestmark = [
    pytest.mark.processes,
    needs.commands("prometheus", install="Debian's prometheus package (make system-deps)"),
]

NS = "default"
NAME = "ds"
PODS = [f"{NAME}-{i}" for i in range(3)]
SPEC: dict[str, Any] = {
    "replicas": 3,
    "replication": {"leaseDurationSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
    "server": {"logFormat": "plain", "longPollTimeoutSeconds": 2},
    "lifecycle": {"terminationGracePeriodSeconds": 10, "readinessPeriodSeconds": 1},
    "certificates": {"issuerRef": {"name": "private-ca", "kind": "ClusterIssuer"}},
    "metrics": {"podMonitor": {"enabled": True, "interval": "1s"}},
}
LIVENESS = 90.0  # seconds any awaited change may take (2 shared cores)
OCTET = {"Content-Type": "application/octet-stream"}


@contextmanager
def small_volume(path: Path, size: str = "16m") -> Iterator[Path]:
    """A real filesystem that fills up, as a pod's data volume (unmounted afterwards)."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(volume: Path, free_ratio: float) -> None:
    """Leave about ``free_ratio`` of ``volume`` free (a file the server does not read)."""
    st = os.statvfs(volume)
    keep = int(st.f_blocks * st.f_frsize * free_ratio)
    size = st.f_bavail * st.f_frsize - keep
    with open(volume / "zz-filler", "wb") as out:
        out.write(b"\0" * max(size, 0))


def status_of(kube: Cluster) -> dict[str, Any]:
    return (kube.get(KIND, NS, NAME) or {}).get("status") or {}


def other_component_pod() -> dict[str, Any]:
    """A Spark pod of the same instance (labels of its own): never a scrape target."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{NAME}-analytics-driver",
            "namespace": NS,
            "labels": {
                "app.kubernetes.io/name": "durable-streams-analytics",
                "app.kubernetes.io/instance": NAME,
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "spark",
                    "image": "spark",
                    "ports": [{"name": "http", "containerPort": 4040}],
                }
            ]
        },
    }


def test_every_pod_is_scraped_over_tls_and_a_standbys_alert_fires(tmp_path: Path) -> None:
    ca = PrivateCA(tmp_path / "ca")
    with (
        small_volume(tmp_path / f"data-{NAME}-2") as standby_volume,
        cluster() as kube,
        running_operator(kube),
    ):
        kube.install_podmonitor_crd()
        kube.install_certificate_crd()
        kube.create(durable_stream(NAME, SPEC)).raise_for_status()
        cert = wait_for(lambda: kube.get("Certificate", NS, f"{NAME}-tls"), message="Certificate")
        cert_manager.issue(kube, ca, cert)  # what cert-manager's CA issuer would write
        dns = [n for n in cert["spec"]["dnsNames"] if not n.startswith("*")]
        with (
            hosts.names(dns),
            Kubelet(kube, NS, NAME, tmp_path, restart_delay=1.0, pod_hostnames=True) as kubelet,
        ):

            def in_sync() -> bool:
                st = status_of(kube)
                return st.get("phase") == "Ready" and st.get("inSyncReplicas") == 3

            wait_for(in_sync, timeout=LIVENESS, message=lambda: f"in sync: {status_of(kube)}")
            primary = status_of(kube)["primary"]
            assert primary == f"{NAME}-0"  # pod 0 starts the set; ds-2 is a standby
            # Over https, checked against the CA and the names in the Certificate: a write
            # to the primary by its pod name is read back from a standby by its own.
            ports = {p: kubelet.url_of(p).rsplit(":", 1)[1] for p in PODS}
            trust = ssl.create_default_context(cafile=str(ca.cert))
            with httpx.Client(verify=trust, timeout=10) as c:
                base = f"https://{primary}.{NAME}-headless.{NS}.svc:{ports[primary]}/v1/stream/"
                stream = f"obs/{uuid.uuid4().hex}"
                assert c.put(base + stream, headers=OCTET).status_code == 201
                assert c.post(base + stream, headers=OCTET, content=b"hello").status_code == 204
                standby = f"https://{NAME}-2.{NAME}-headless.{NS}.svc:{ports[f'{NAME}-2']}"

                def replicated() -> bool:
                    r = c.get(f"{standby}/v1/stream/{stream}", params={"offset": "-1"})
                    return r.status_code == 200 and r.content == b"hello"

                wait_for(replicated, timeout=LIVENESS, message="the standby has the append")
            # What the old ServiceMonitor reached: the client Service's pods, the primary.
            selector = kube.get("Service", NS, NAME)["spec"]["selector"]
            reached = [
                p["metadata"]["name"]
                for p in kube.list("Pod", NS)
                if selector.items() <= (p["metadata"].get("labels") or {}).items()
            ]
            assert reached == [primary]

            kube.create(other_component_pod()).raise_for_status()
            monitor = kube.get("PodMonitor", NS, NAME)

            def address(pod: str) -> str | None:
                if pod in PODS:
                    url = kubelet.url_of(pod)
                    return url.split("://")[1] if url else None
                return "127.0.0.1:9"  # some other pod's IP and port

            with pod_discovery.serving(kube, NS, address) as discovery:
                jobs = scrape_configs(kube, monitor, discovery, tmp_path / "prometheus-secrets")
                prom = Prometheus(tmp_path, [], scrape_configs=jobs)
                try:
                    check_every_pod_scraped(prom)
                    fill(standby_volume, 0.05)
                    check_standby_disk_alert(prom, f"{NAME}-2")
                finally:
                    prom.stop()


def check_every_pod_scraped(prom: Prometheus) -> None:
    def up() -> dict[str, dict[str, str]] | None:
        series = {s["metric"]["pod"]: s for s in prom.query('up{job="durable-streams"}')}
        if sorted(series) != PODS or any(s["value"][1] != "1" for s in series.values()):
            return None
        return {pod: s["metric"] for pod, s in series.items()}

    labels = wait_for(up, timeout=LIVENESS, message=lambda: f"targets: {prom.log()}")
    for metric in labels.values():
        assert metric["namespace"] == NS and metric["endpoint"] == "http", metric
        assert metric["instance"].startswith("127.0.0.1:"), metric  # the pod's address
    assert len({m["instance"] for m in labels.values()}) == 3
    # The pod of another component was discovered, and dropped by the selector.
    targets = prom.get("targets")
    dropped = [t["discoveredLabels"] for t in targets["droppedTargets"]]
    assert any(d.get("__meta_kubernetes_pod_name") == f"{NAME}-analytics-driver" for d in dropped)
    pool = f"podMonitor/{NS}/{NAME}/0"
    assert len([t for t in targets["activeTargets"] if t["scrapePool"] == pool]) == 3
    # The series the per-pod alerts read, for every pod.
    for metric in ("durable_streams_ready", "durable_streams_storage_failed"):
        by_pod = {s["metric"]["pod"] for s in prom.query(f'{metric}{{job="durable-streams"}}')}
        assert sorted(by_pod) == PODS, (metric, by_pod)


def check_standby_disk_alert(prom: Prometheus, standby: str) -> None:
    def pending() -> set[tuple[str, str]] | None:
        alerts = {
            (a["labels"].get("pod", ""), a["state"])
            for a in prom.alerts()
            if a["labels"]["alertname"] == "DurableStreamsDiskNearlyFull"
        }
        return alerts if (standby, "pending") in alerts else None

    alerts = wait_for(pending, timeout=LIVENESS, message=lambda: f"alerts: {prom.alerts()}")
    assert {pod for pod, _ in alerts} == {standby}
