"""The operator image reconciles a DurableStream against the emulated API server.

The container runs as the chart's Deployment runs it (its environment, leader
election on, read-only root without a writable /tmp, no capabilities) and
reaches the emulated API server (testkit.kube) on the host's network through
a kubeconfig. The test plays the StatefulSet controller and the kubelet's
volume part, as tests/operator does with the operator in-process.
"""

from __future__ import annotations

import httpx
import pytest
import yaml

from stream_operator import KIND
from testkit import free_port, wait_for
from testkit.cluster import cluster
from testkit.containers import PODMAN_NEEDED
from testkit.kube import durable_stream
from testkit.pod_objects import claim_volumes, statefulset_status

pytestmark = [pytest.mark.processes, PODMAN_NEEDED, pytest.mark.timeout(1800)]

NS = "default"
POD = "durable-streams-operator-7d4b9-x2x"
LEASE = "durable-streams-operator"


def kubeconfig(url: str) -> str:
    """What a user's kubeconfig for the emulated API server looks like (no TLS, a token)."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulated", "cluster": {"server": url}}],
            "users": [{"name": "tests", "user": {"token": "not-checked"}}],
            "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "tests"}}],
            "current-context": "emulated",
        }
    )


def test_the_operator_image_reconciles_against_the_emulated_api_server(podman, images, tmp_path):
    config = tmp_path / "kubeconfig"
    metrics_port = free_port()
    with cluster() as c:
        config.write_text(kubeconfig(c.url))
        config.chmod(0o644)
        env = {
            "KUBECONFIG": "/etc/durable-streams/kubeconfig",
            "POD_NAME": POD,
            "POD_NAMESPACE": NS,
            "DS_OPERATOR_LEADER_ELECTION": "true",
            "DS_OPERATOR_LEASE_NAME": LEASE,
            "DS_OPERATOR_METRICS_PORT": str(metrics_port),
            "DS_OPERATOR_SERVER_IMAGE": images["durable-streams-server"],
            "DS_OPERATOR_RESYNC_INTERVAL": "1",
            "DS_OPERATOR_STATUS_INTERVAL": "1",
        }
        with podman.run(
            images["durable-streams-operator"],
            env=env,
            volumes={config: "/etc/durable-streams/kubeconfig:ro"},
            read_only=True,
            extra=["--cap-drop=ALL", "--security-opt=no-new-privileges"],
        ) as box:
            try:
                healthz = f"http://127.0.0.1:{metrics_port}/healthz"

                def healthy() -> bool:
                    assert box.running(), "the operator container exited"
                    try:
                        return httpx.get(healthz, timeout=2).status_code == 200
                    except httpx.HTTPError:
                        return False

                wait_for(healthy, timeout=60, message="the operator's /healthz")
                lease = wait_for(
                    lambda: c.get("Lease", NS, LEASE), timeout=60, message="the operator's Lease"
                )
                assert lease["spec"]["holderIdentity"] == POD

                c.create(durable_stream("events", {"replicas": 1})).raise_for_status()
                sts = wait_for(
                    lambda: c.get("StatefulSet", NS, "events"), timeout=60, message="StatefulSet"
                )
                (server,) = sts["spec"]["template"]["spec"]["containers"]
                assert server["image"] == images["durable-streams-server"]
                claim_volumes(c, sts)
                status = statefulset_status(sts, 1, 1, 1, "r1", "r1")
                c.patch("StatefulSet", NS, "events", {"status": status}, status=True)
                wait_for(
                    lambda: (
                        ((c.get(KIND, NS, "events") or {}).get("status") or {}).get("phase")
                        == "Ready"
                    ),
                    timeout=60,
                    message="the DurableStream Ready",
                )
                agents = {call.agent for call in c.api.requests}
                assert any(POD in agent for agent in agents), agents
            except BaseException:
                print(box.logs())
                raise
