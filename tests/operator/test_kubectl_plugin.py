"""Issue 25: ``kubectl dstream``, the plugin, run as a user runs it: the real console entry
(``cli.main``, in the test's process: ``testkit.kubectl_plugin.plugin``; once in a
process of its own through kubectl's own plugin lookup), with a kubeconfig pointing at
the emulated API server.

The DurableStream, its pods, its Lease and its Events are written as the real operator
and the servers write them (the operator runs; the test plays the StatefulSet
controller, the kubelet and the servers' Lease writes). A switchover is carried out by
the real operator, with ``primary_stand_in`` answering as the primary.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from primary_stand_in import StandIn, primary_stand_in

from stream_operator import KIND
from testkit import rbac, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.kubectl_plugin import (
    documented_role,
    environment,
    kubeconfig,
    plugin,
    running_replica_set,
    set_pod,
    status_of,
)
from testkit.kubelet import Kubelet
from testkit.leases import write_replica_lease
from testkit.operator import running_operator
from testkit.pod_objects import statefulset_status

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
NS = "team-a"  # the kubeconfig context's namespace: no -n needed
POSITIONS = "streams.pyds.dev/positions"
FENCED = "streams.pyds.dev/fenced-instances"
HIBERNATION = "streams.pyds.dev/hibernation"


def annotations(c: Cluster, name: str = "events") -> dict[str, str]:
    return ((c.get(KIND, NS, name) or {}).get("metadata") or {}).get("annotations") or {}


def events(c: Cluster, reason: str) -> list[str]:
    return [
        e["message"]
        for e in c.list("Event", NS)
        if e["involvedObject"]["name"] == "events" and e["reason"] == reason
    ]


def write_positions(c: Cluster, positions: dict[str, list[int]]) -> None:
    """The positions the primary writes into its Lease at each renewal."""
    body = {"metadata": {"annotations": {POSITIONS: json.dumps(positions)}}}
    c.patch("Lease", NS, "events-leader", body).raise_for_status()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    with cluster() as c, running_operator(c):
        yield c, kubeconfig(tmp_path / "config", c.url)


@pytest.fixture
def with_primary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Cluster, Path, StandIn]]:
    from stream_operator.controllers import replica_set

    # Status rounds (where a switchover is made), not whole reconciles, every second.
    monkeypatch.setenv("DS_OPERATOR_RESYNC_INTERVAL", "30")  # read as the operator starts
    with cluster() as c, primary_stand_in(c.url, NS, "events") as stand_in:
        replica_set.use_pod_urls(stand_in.url)
        try:
            with running_operator(c):
                yield c, kubeconfig(tmp_path / "config", c.url), stand_in
        finally:
            replica_set.use_pod_urls(None)


def test_status_says_each_replicas_role_lag_term_and_the_last_failover(
    kube: tuple[Cluster, Path],
):
    c, config = kube
    sts = running_replica_set(c)
    write_replica_lease(c, "events", NS, "events-0", 1, ["events-1", "events-2"])
    wait_for(lambda: events(c, "PrimaryElected"), message="the election's Event")
    # A failover: events-2 takes the Lease in term 2; events-0 restarted and lags.
    write_replica_lease(c, "events", NS, "events-2", 2, ["events-1"])
    write_positions(c, {"events-2": [2, 120], "events-1": [2, 117], "events-0": [1, 90]})
    set_pod(c, sts, "events-0", ready=False, restarts=3)
    rev = f"events-{sts['metadata']['generation']}"
    two = statefulset_status(sts, 3, 2, 3, rev, rev)
    c.patch("StatefulSet", NS, "events", {"status": two}, status=True).raise_for_status()
    wait_for(lambda: status_of(c).get("readyReplicas") == 2, message="2/3 ready")
    wait_for(
        lambda: (
            [r.get("lagBatches") for r in status_of(c).get("replicaStatus") or []] == [30, 3, 0]
        ),
        message=lambda: f"the lag in the status: {status_of(c)}",
    )
    wait_for(lambda: events(c, "PrimaryChanged"), message="the failover's Event")

    done = plugin(config, "status", "events", "-o", "json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["namespace"], got["primary"], got["term"]) == (NS, "events-2", 2)
    assert got["lease"]["holder"] == "events-2" and got["lease"]["term"] == 2
    assert got["lease"]["inSync"] == ["events-1", "events-2"]
    assert [
        (
            r["pod"],
            r["role"],
            r["ready"],
            r["inSync"],
            r["position"],
            r["lagBatches"],
            r["restarts"],
        )
        for r in got["pods"]
    ] == [
        ("events-0", "standby", False, False, [1, 90], 30, 3),
        ("events-1", "standby", True, True, [2, 117], 3, 0),
        ("events-2", "primary", True, True, [2, 120], 0, 0),
    ]
    assert got["lastPrimaryChange"]["reason"] == "PrimaryChanged"
    assert got["lastPrimaryChange"]["message"] == "failover: primary events-0 -> events-2 (term 2)"
    # Only the conditions that are not as they should be: events-0 is not ready.
    unexpected = {c["type"]: c["status"] for c in got["conditions"]}
    assert unexpected == {"Ready": "False", "Degraded": "True"}

    text = plugin(config, "status", "events")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"DurableStream {NS}/events: ")
    assert "Primary:      events-2 (term 2), 2 in sync" in lines
    assert any(
        line.startswith("Last change:  PrimaryChanged (Warning) ")
        and line.endswith("failover: primary events-0 -> events-2 (term 2)")
        for line in lines
    ), lines
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == [
        "POD", "ROLE", "READY", "IN-SYNC", "POSITION", "LAG-BATCHES", "RESTARTS", "FENCED"
    ]  # fmt: skip
    assert table[1].split() == ["events-0", "standby", "no", "no", "[1,", "90]", "30", "3", "no"]
    assert table[3].split() == ["events-2", "primary", "yes", "yes", "[2,", "120]", "0", "0", "no"]


def test_kubectl_finds_the_plugin_on_the_path_and_passes_its_flags(
    kube: tuple[Cluster, Path], tmp_path: Path
):
    c, config = kube
    running_replica_set(c, replicas=1)
    wait_for(lambda: status_of(c).get("phase") == "Ready", message="Ready")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl-dstream"  # what pip's console script is, in a test's tree
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m stream_operator.plugin "$@"\n')
    script.chmod(0o755)
    env = environment(config)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    done = subprocess.run(
        [kubectl, "dstream", "--context", "elsewhere", "status", "events", "-n", NS],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"DurableStream {NS}/events: Ready, 1/1 servers ready")
    assert "Replicas:     one server (not a replica set: no Lease, no standbys)" in done.stdout


def test_a_switchover_is_carried_out_by_the_operator_and_its_outcome_reported(
    with_primary: tuple[Cluster, Path, StandIn],
):
    c, config, stand_in = with_primary
    running_replica_set(c)
    write_replica_lease(c, "events", NS, "events-1", 3, ["events-0", "events-2"])
    wait_for(lambda: status_of(c).get("phase") == "Ready", message="Ready")

    done = plugin(config, "switchover", "events", "events-2", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "durablestream/events annotated streams.pyds.dev/switchover-to=events-2",
        "switchover events-1 -> events-2 (term 4, writes held 4 ms) asked for with "
        "streams.pyds.dev/switchover-to",
        "events-2 is the primary now (term 4)",
    ]
    assert [(pod, target, code) for pod, target, code in stand_in.calls] == [
        ("events-1", "events-2", 200)
    ]
    assert "streams.pyds.dev/switchover-to" not in annotations(c)

    # The primary refuses (the target did not catch up in time): the Event's words, 1.
    stand_in.fail_next(503, "CATCHUP_TIMEOUT")
    failed = plugin(config, "switchover", "events", "events-0")
    assert failed.returncode == 1
    assert failed.stderr.startswith("error: the operator did not switch over: switchover ")
    assert "503 CATCHUP_TIMEOUT" in failed.stderr
    assert status_of(c)["primary"] == "events-2"

    # A target out of sync: the operator refuses it without asking the primary.
    write_replica_lease(c, "events", NS, "events-2", 4, ["events-1"])
    refused = plugin(config, "switchover", "events", "events-0")
    assert refused.returncode == 1
    assert refused.stderr == (
        "error: the operator did not switch over: streams.pyds.dev/switchover-to=events-0: "
        "events-0 is not in sync (in sync: events-1, events-2)\n"
    )
    assert len(stand_in.calls) == 2

    # Checked before any annotation is written.
    stranger = plugin(config, "switchover", "events", "events-7")
    assert (stranger.returncode, stranger.stderr) == (
        1,
        "error: events-7 is not a pod of events (events-0, events-1, events-2)\n",
    )
    already = plugin(config, "switchover", "events", "events-2")
    assert (already.returncode, already.stdout) == (0, "events-2 is the primary already (term 4)\n")
    assert "streams.pyds.dev/switchover-to" not in annotations(c)


def test_hibernate_and_fence_write_the_annotations_the_operator_reads(
    kube: tuple[Cluster, Path],
):
    c, config = kube
    running_replica_set(c)

    assert plugin(config, "hibernate", "events", "on").returncode == 0
    assert annotations(c)[HIBERNATION] == "on"
    assert plugin(config, "hibernate", "events", "off").returncode == 0
    assert annotations(c)[HIBERNATION] == "off"

    done = plugin(config, "fence", "events", "events-2", "events-0")
    assert (done.returncode, done.stdout) == (
        0,
        "durablestream/events fenced instances: events-0, events-2\n",
    )
    assert json.loads(annotations(c)[FENCED]) == ["events-0", "events-2"]
    assert plugin(config, "unfence", "events", "events-0").returncode == 0
    assert json.loads(annotations(c)[FENCED]) == ["events-2"]
    stranger = plugin(config, "fence", "events", "events-3")
    assert (stranger.returncode, stranger.stderr) == (
        1,
        "error: events-3: not a pod of events (events-0, events-1, events-2)\n",
    )
    assert plugin(config, "fence", "events", "--all").returncode == 0
    assert json.loads(annotations(c)[FENCED]) == ["*"]
    one = plugin(config, "unfence", "events", "events-2")
    assert one.returncode == 1 and "unfence --all" in one.stderr
    assert json.loads(annotations(c)[FENCED]) == ["*"]
    shown = json.loads(plugin(config, "status", "events", "-o", "json").stdout)
    assert shown["annotations"] == {"fencedInstances": '["*"]', "hibernation": "off"}
    assert all(r["fenced"] for r in shown["pods"])
    assert plugin(config, "unfence", "events", "--all").returncode == 0
    assert FENCED not in annotations(c)


def test_errors_are_plain_and_exit_with_status_one(kube: tuple[Cluster, Path]):
    c, config = kube
    missing = plugin(config, "status", "nothing")
    assert (missing.returncode, missing.stderr) == (
        1,
        f'error: DurableStream "nothing" not found in namespace "{NS}"\n',
    )
    c.create(durable_stream("single", {}, NS)).raise_for_status()
    elsewhere = plugin(config, "--context", "elsewhere", "hibernate", "single", "on")
    assert elsewhere.stderr == 'error: DurableStream "single" not found in namespace "default"\n'
    single = plugin(config, "switchover", "single", "single-0")
    assert (single.returncode, single.stderr) == (
        1,
        "error: single is not a replica set (replicas: 1): a switchover needs one\n",
    )
    context = plugin(config, "--context", "nowhere", "status", "single")
    assert context.returncode == 1
    assert context.stderr.startswith("error: context 'nowhere' not found in ")
    assert (
        plugin(config, "unfence", "single").stderr == "error: name the pods to unfence, or --all\n"
    )
    written = annotations(c, "single")
    assert not {HIBERNATION, FENCED, "streams.pyds.dev/switchover-to"} & set(written)


# Short leases, so the servers elect at once (the e2e replica-set test's timings).
LIVE_SPEC: dict[str, Any] = {
    "replicas": 2,
    "replication": {"leaseDurationSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
    "server": {"logFormat": "plain"},
    "lifecycle": {"readinessPeriodSeconds": 1},
    # Plain HTTP: the kubelet stand-in reaches pods at 127.0.0.1, which the built-in CA's
    # certificate does not name (TLS over it: tests/replication/test_builtin_ca_set.py).
    "certificates": {"builtIn": False},
}


def test_live_status_and_a_switchover_with_real_servers_and_only_the_documented_rights(
    tmp_path: Path,
):
    """The pods are real server processes (the kubelet stand-in) that elect their primary
    through the Lease: ``--live`` reads each one's ``GET /replication`` through the API
    server's pod proxy, a switchover is made by the real primary, and every request the
    plugin made is granted by the ClusterRole the docs give, which grants nothing else."""
    from stream_operator.controllers import replica_set

    with (
        cluster() as c,
        running_operator(c),
        Kubelet(c, NS, "events", tmp_path / "pods", restart_delay=1.0) as kubelet,
    ):
        config = kubeconfig(tmp_path / "config", c.url)
        c.api.pod_network = lambda namespace, pod, port: kubelet.url_of(pod)
        replica_set.use_pod_urls(kubelet.pod_url)
        try:
            c.create(durable_stream("events", LIVE_SPEC, NS)).raise_for_status()
            wait_for(
                lambda: (
                    status_of(c).get("inSyncReplicas") == 2 and status_of(c).get("phase") == "Ready"
                ),
                timeout=120,
                message=lambda: f"two in sync: {status_of(c)}",
            )
            primary = status_of(c)["primary"]
            standby = next(p for p in ("events-0", "events-1") if p != primary)

            done = plugin(config, "status", "events", "--live", "-o", "json")
            assert done.returncode == 0, done.stderr
            live = {r["pod"]: r["live"] for r in json.loads(done.stdout)["pods"]}
            assert live[primary]["role"] == "primary" and live[primary]["lagBatches"] == 0
            assert live[standby]["role"] == "standby" and live[standby]["problem"] is None
            assert all(isinstance(x, int) for x in live[standby]["durable"])
            assert isinstance(live[standby]["lagBatches"], int)
            text = plugin(config, "status", "events", "--live")
            assert "LIVE-ROLE" in text.stdout.splitlines()[-3]

            moved = plugin(config, "switchover", "events", standby, "--timeout", "90")
            assert moved.returncode == 0, moved.stderr
            assert moved.stdout.splitlines()[-1].startswith(f"{standby} is the primary now")
            assert status_of(c)["primary"] == standby
            for args in (("fence", "events", primary), ("unfence", "events", primary)):
                assert plugin(config, *args).returncode == 0
            assert plugin(config, "hibernate", "events", "off").returncode == 0
        finally:
            replica_set.use_pod_urls(None)
        calls = [x for x in c.api.requests if x.agent.startswith("kubectl-dstream")]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "plugin-user", "namespace": NS},
        "roleRef": {"kind": "ClusterRole", "name": "durable-streams-kubectl-plugin"},
        "subjects": [{"kind": "ServiceAccount", "name": "user", "namespace": NS}],
    }
    granted = rbac.grants([documented_role(), binding], "user", NS)
    assert rbac.denied(calls, granted) == []
    assert rbac.unused(calls, granted) == []
