"""Running ``kubectl dstream`` as a user runs it, against the emulated API server: a
kubeconfig as kubectl writes one, and the plugin's console entry (``cli.main``, what
``python -m stream_operator.plugin`` calls) with ``KUBECONFIG`` naming it
(tests/operator/test_kubectl_plugin.py, test_kubectl_backup.py, ...).

``plugin`` calls the entry in the test's process, its output captured; ``plugin_process``
runs it in a process of its own. A process costs its imports each time (the kubernetes
package alone 2-5 s on this machine, 45 calls in the suite), and the plugin keeps no
state between calls: it builds its client from the kubeconfig it is given, never from
kubernetes' global configuration. The entry as installed (kubectl finding
``kubectl-dstream`` on the path) has a test of its own.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

ROOT = Path(__file__).resolve().parent.parent
NS = "team-a"  # the kubeconfig context's namespace: no -n needed


def kubeconfig(path: Path, url: str, namespace: str = NS) -> Path:
    """A kubeconfig as kubectl writes one: the emulated API server, a user, a context."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": url}}],
                "users": [{"name": "tester", "user": {"token": "not-checked"}}],
                "contexts": [
                    {
                        "name": "emulated",
                        "context": {
                            "cluster": "emulated",
                            "user": "tester",
                            "namespace": namespace,
                        },
                    },
                    {
                        "name": "elsewhere",
                        "context": {"cluster": "emulated", "user": "tester"},
                    },
                ],
                "current-context": "emulated",
            }
        )
    )
    return path


def environment(config: Path) -> dict[str, str]:
    tree = f"{ROOT / 'server'}{os.pathsep}{ROOT / 'operator'}{os.pathsep}{ROOT}"
    return {**os.environ, "KUBECONFIG": str(config), "PYTHONPATH": tree}


_one_at_a_time = threading.Lock()  # the environment and sys.stdout are the process's


def plugin(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl dstream ARGS`` in this process: the entry's exit status, what it wrote
    to stdout and to stderr (argparse's usage errors exit, with status 2, as they would)."""
    from stream_operator.plugin.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        _one_at_a_time,
        mock.patch.dict(os.environ, {"KUBECONFIG": str(config)}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    argv = ["kubectl-dstream", *args]
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def plugin_process(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl dstream ARGS``: the plugin's console entry in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "stream_operator.plugin", *args],
        env=environment(config),
        capture_output=True,
        text=True,
        timeout=120,
    )


NS = "team-a"  # the test kubeconfig's namespace: no -n needed
ROOT = Path(__file__).resolve().parents[1]


def status_of(c: Cluster) -> dict[str, Any]:
    return (c.get(KIND, NS, "events") or {}).get("status") or {}


def set_pod(c: Cluster, sts: dict[str, Any], pod: str, *, ready: bool, restarts: int) -> None:
    """The kubelet's report of a pod's readiness and its container's restarts."""
    container = sts["spec"]["template"]["spec"]["containers"][0]
    status = pod_status(container, ready=ready, restarts=restarts)
    c.patch("Pod", NS, pod, {"status": status}, status=True).raise_for_status()


def running_replica_set(c: Cluster, replicas: int = 3) -> dict[str, Any]:
    """The DurableStream, then what the StatefulSet controller and the kubelet would do."""
    # Plain HTTP: the tests' stand-ins for the servers serve no TLS.
    spec = {"replicas": replicas, "certificates": {"builtIn": False}}
    c.create(durable_stream("events", spec, NS)).raise_for_status()
    sts = wait_for(lambda: c.get("StatefulSet", NS, "events"), message="the StatefulSet")
    claim_volumes(c, sts)
    for i in range(replicas):
        c.create(pod_object(sts, i)).raise_for_status()
        set_pod(c, sts, f"events-{i}", ready=True, restarts=0)
    rev = f"events-{sts['metadata']['generation']}"
    status = statefulset_status(sts, replicas, replicas, replicas, rev, rev)
    c.patch("StatefulSet", NS, "events", {"status": status}, status=True).raise_for_status()
    return sts


def documented_role() -> dict[str, Any]:
    """The ClusterRole docs/kubernetes.md gives a user of the plugin, as it is printed."""
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    section = doc.split("## The kubectl plugin", 1)[1].split("\n## ", 1)[0]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    role = yaml.safe_load("\n".join(line.removeprefix("  ") for line in block.splitlines()))
    assert role["kind"] == "ClusterRole"
    return role
