"""Issue 42: ``kubectl dstream restart``, ``logs`` and ``report``, run as a user runs them
(the console entry, in the test's process: ``testkit.kubectl_plugin.plugin``) against
the emulated API server, with the real operator running.

The test plays the StatefulSet controller and the kubelet (``testkit.kubectl_plugin``'s
``running_replica_set``), the servers' Lease, what each container wrote (the emulator's
``pods/log``, ``testkit.pod_logs``) and each server's own answers behind the pod proxy.
"""

from __future__ import annotations

import base64
import json
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_operator import KIND
from testkit import rbac, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kubectl_plugin import (
    ROOT,
    documented_role,
    kubeconfig,
    plugin,
    running_replica_set,
    status_of,
)
from testkit.leases import write_replica_lease
from testkit.operator import running_operator
from testkit.pod_logs import LogBook
from testkit.pod_objects import statefulset_status

pytestmark = pytest.mark.processes

NS = "team-a"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    with cluster() as c, running_operator(c):
        yield c, kubeconfig(tmp_path / "config", c.url)


def pods(c: Cluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in c.list("Pod", NS))


def template_annotations(c: Cluster) -> dict[str, str]:
    sts = c.get("StatefulSet", NS, "events") or {}
    return sts["spec"]["template"]["metadata"].get("annotations") or {}


def plugin_rights() -> dict[str, Any]:
    """The further rules docs/kubernetes.md gives for restart, logs and report (its
    second ClusterRole in "The kubectl plugin")."""
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    section = doc.split("## The kubectl plugin", 1)[1].split("\n## ", 1)[0]
    block = section.split("```yaml\n")[2].split("```", 1)[0]
    role = yaml.safe_load("\n".join(line.removeprefix("  ") for line in block.splitlines()))
    assert role["kind"] == "ClusterRole"
    return role


def test_restart_rolls_through_the_operator_primary_last_or_deletes_one_pod(
    kube: tuple[Cluster, Path],
):
    c, config = kube
    sts = running_replica_set(c)
    write_replica_lease(c, "events", NS, "events-0", 1, ["events-1", "events-2"])
    wait_for(lambda: status_of(c).get("primary") == "events-0", message="events-0 primary")

    done = plugin(config, "restart", "events")
    assert done.returncode == 0, done.stderr
    when = (c.get(KIND, NS, "events") or {})["metadata"]["annotations"][RESTARTED_AT]
    assert done.stdout == (
        f"durablestream/events annotated {RESTARTED_AT}={when}: the operator restarts the "
        "standbys one at a time, then the primary after a switchover\n"
    )
    # The operator (a status round, which asks for a converge) puts it in the template.
    wait_for(lambda: template_annotations(c).get(RESTARTED_AT) == when, message="the template")
    new = c.get("StatefulSet", NS, "events")
    assert new is not None and new["spec"]["updateStrategy"]["type"] == "OnDelete"
    # The controller reports the new revision: the operator's rolling update replaces a
    # standby first (the highest ordinal), never the primary while it holds the Lease.
    old, rev = f"events-{sts['metadata']['generation']}", f"events-{new['metadata']['generation']}"
    for pod in ("events-0", "events-1", "events-2"):  # made from the old revision
        labels = {"metadata": {"labels": {"controller-revision-hash": old}}}
        c.patch("Pod", NS, pod, labels).raise_for_status()
    status = statefulset_status(new, 3, 3, 0, old, rev)
    c.patch("StatefulSet", NS, "events", {"status": status}, status=True).raise_for_status()
    wait_for(lambda: "events-2" not in pods(c), message="the first standby replaced")
    assert "events-0" in pods(c) and "events-1" in pods(c)

    primary = plugin(config, "restart", "events", "--pod", "0")
    assert primary.returncode == 1
    assert primary.stderr.startswith("error: events-0 is the primary: deleting its pod fails")
    assert "kubectl dstream switchover events POD" in primary.stderr and "--force" in primary.stderr
    assert "events-0" in pods(c)
    one = plugin(config, "restart", "events", "--pod", "events-1")
    assert (one.returncode, one.stdout) == (
        0,
        "pod/events-1 deleted: its StatefulSet makes it again\n",
    )
    assert "events-1" not in pods(c)
    forced = plugin(config, "restart", "events", "--pod", "0", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "events-0" not in pods(c)
    stranger = plugin(config, "restart", "events", "--pod", "7")
    assert stranger.stderr == "error: 7 is not a pod of events (events-0, events-1, events-2)\n"


def test_logs_of_every_pod_prefixed_previous_and_since(kube: tuple[Cluster, Path]):
    c, config = kube
    running_replica_set(c, replicas=2)
    book = c.api.pod_logs = LogBook()
    book.write(NS, "events-1", "crashed: disk full")
    book.restart(NS, "events-1")
    book.write(NS, "events-0", "listening on :4437\nprimary for term 1")
    book.write(NS, "events-1", "listening on :4437")

    done = plugin(config, "logs", "events")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[pod/events-0/server] listening on :4437",
        "[pod/events-0/server] primary for term 1",
        "[pod/events-1/server] listening on :4437",
    ]
    followed = plugin(config, "logs", "events", "--follow", "--since", "1h")
    assert sorted(followed.stdout.splitlines()) == done.stdout.splitlines()
    previous = plugin(config, "logs", "events", "--pod", "1", "--previous")
    assert previous.stdout == "[pod/events-1/server] crashed: disk full\n"
    # events-0 never restarted: said on stderr, the other pod's log printed all the same.
    both = plugin(config, "logs", "events", "-p")
    assert both.returncode == 1
    assert both.stdout == "[pod/events-1/server] crashed: disk full\n"
    assert "could not read the log of events-0: 400" in both.stderr
    bad = plugin(config, "logs", "events", "--since", "yesterday")
    assert bad.stderr == "error: --since yesterday: not a duration such as 30s, 5m or 1h30m\n"


class _Server(BaseHTTPRequestHandler):
    """A server's own answers, behind the pod proxy."""

    def do_GET(self) -> None:
        answers = {"/replication": {"role": "primary"}, "/_archive/status": {"lastArchivedLSN": 7}}
        body = json.dumps(answers.get(self.path, {"error": "no such path"})).encode()
        self.send_response(200 if self.path in answers else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_report_writes_a_zip_with_a_manifest_and_no_secret(
    kube: tuple[Cluster, Path], tmp_path: Path
):
    c, config = kube
    running_replica_set(c, replicas=2)
    write_replica_lease(c, "events", NS, "events-0", 1, ["events-1"])
    wait_for(lambda: status_of(c).get("primary") == "events-0", message="events-0 primary")
    book = c.api.pod_logs = LogBook()
    book.write(NS, "events-0", "primary for term 1")
    book.write(NS, "events-1", "old run")
    book.restart(NS, "events-1")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    c.api.pod_network = lambda _ns, pod, _port: origin if pod == "events-0" else None
    secret = wait_for(lambda: c.get("Secret", NS, "events-replication"), message="the token")
    token = base64.b64decode(next(iter(secret["data"].values()))).decode()
    start = len(c.api.requests)
    try:
        done = plugin(config, "report", "events", "-o", str(tmp_path / "bundle.zip"))
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"DurableStream {NS}/events: support bundle written to ")

    with zipfile.ZipFile(tmp_path / "bundle.zip") as z:
        files = {n.removeprefix("events-report/"): z.read(n).decode() for n in z.namelist()}
    manifest = json.loads(files["manifest.json"])
    assert sorted(manifest["files"]) == sorted(f for f in files if f != "manifest.json")
    assert manifest["durableStream"] == "events" and manifest["pods"] == ["events-0", "events-1"]
    assert "events-replication" in manifest["secrets"]["names"]
    assert all(token not in text for text in files.values())  # names only, never data
    ds = yaml.safe_load(files["durablestream.yaml"])
    assert ds["status"]["primary"] == "events-0" and "managedFields" not in ds["metadata"]
    for owned in (
        "objects/statefulset-events.yaml",
        "objects/service-events.yaml",
        "objects/poddisruptionbudget-events.yaml",
        "objects/lease-events-leader.yaml",
        "pods/events-0/pod.yaml",
        "pods/events-0/events.yaml",
    ):
        assert owned in files, sorted(files)
    assert files["pods/events-0/server.log"] == "primary for term 1\n"
    assert files["pods/events-1/server-previous.log"] == "old run\n"
    assert json.loads(files["pods/events-0/replication.json"]) == {"role": "primary"}
    assert json.loads(files["pods/events-0/archive-status.json"]) == {"lastArchivedLSN": 7}
    # What could not be read says why: events-0 never restarted, events-1 does not answer.
    assert manifest["unread"]["pods/events-0/server-previous.log"].startswith("400")
    assert manifest["unread"]["pods/events-1/replication.json"].startswith("503")
    assert "operator.yaml" in files  # the emulator has no operator Deployment: an empty list

    # The documented rights cover every request it made.
    calls = [x for x in c.api.requests[start:] if x.agent.startswith("kubectl-dstream")]
    user = [{"kind": "ServiceAccount", "name": "user", "namespace": NS}]
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "plugin-user", "namespace": NS},
            "roleRef": {"kind": "ClusterRole", "name": "durable-streams-kubectl-plugin"},
            "subjects": user,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "plugin-support"},
            "roleRef": {"kind": "ClusterRole", "name": "durable-streams-kubectl-plugin-support"},
            "subjects": user,
        },
    ]
    granted = rbac.grants([documented_role(), plugin_rights(), *bindings], "user", NS)
    assert rbac.denied(calls, granted) == []

    into_dir = plugin(config, "report", "events", "-o", str(tmp_path / "out"))
    assert into_dir.returncode == 0, into_dir.stderr
    (made,) = (tmp_path / "out").iterdir()
    assert made.name.startswith("events-report-") and made.suffix == ".zip"
    missing = plugin(config, "report", "nothing")
    assert missing.stderr == f'error: DurableStream "nothing" not found in namespace "{NS}"\n'


def test_the_support_bundle_names_secrets_from_the_pod_template():
    from stream_operator.plugin.bundle import secret_names

    sts = {
        "spec": {
            "template": {
                "spec": {
                    "imagePullSecrets": [{"name": "pull"}],
                    "volumes": [
                        {"name": "tls", "secret": {"secretName": "tls"}},
                        {"name": "p", "projected": {"sources": [{"secret": {"name": "proj"}}]}},
                    ],
                    "containers": [
                        {
                            "env": [{"valueFrom": {"secretKeyRef": {"name": "env", "key": "k"}}}],
                            "envFrom": [{"secretRef": {"name": "from"}}],
                        }
                    ],
                }
            }
        }
    }
    assert secret_names(sts) == ["env", "from", "proj", "pull", "tls"]
    assert secret_names(None) == []
