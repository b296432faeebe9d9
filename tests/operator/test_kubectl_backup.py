"""``kubectl dstream backup`` and the archive lines of ``kubectl dstream status``: the
plugin's console entry (in the test's process: ``testkit.kubectl_plugin.plugin``), the
real operator taking the backup, the servers'
archive endpoints played by testkit.archive_stand_in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import wait_for
from testkit.archive_stand_in import ArchiveStandIn, archive_stand_in
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.kubectl_plugin import NS, kubeconfig, plugin
from testkit.operator import running_operator
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

pytestmark = pytest.mark.processes

STORE = {"objectStore": {"destinationPath": "s3://bucket/events"}}


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[Cluster, Path, ArchiveStandIn]]:
    from stream_operator.controllers import replica_set

    with cluster() as c, archive_stand_in() as stand_in:
        replica_set.use_pod_urls(stand_in.url)
        try:
            with running_operator(c):
                yield c, kubeconfig(tmp_path / "config", c.url), stand_in
        finally:
            replica_set.use_pod_urls(None)


def one_server(c: Cluster, spec: dict) -> None:
    c.create(durable_stream("events", spec, NS)).raise_for_status()
    sts = wait_for(lambda: c.get("StatefulSet", NS, "events"), message="the StatefulSet")
    claim_volumes(c, sts)
    c.create(pod_object(sts, 0)).raise_for_status()
    container = sts["spec"]["template"]["spec"]["containers"][0]
    ready = {"status": pod_status(container, ready=True, restarts=0)}
    c.patch("Pod", NS, "events-0", ready, status=True).raise_for_status()
    rev = f"events-{sts['metadata']['generation']}"
    status = statefulset_status(sts, 1, 1, 1, rev, rev)
    c.patch("StatefulSet", NS, "events", {"status": status}, status=True).raise_for_status()


def test_backup_creates_a_backup_waits_for_it_and_status_shows_the_archive(kube):
    c, config, stand_in = kube
    one_server(c, {"backup": STORE})
    done = plugin(config, "backup", "events", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    created, _, outcome = done.stdout.partition("\n")
    assert created.startswith("durablestreambackup/events-manual-")
    assert json.loads(outcome)["backupID"] == stand_in.backups[0]["id"]
    wait_for(
        lambda: (c.get("DurableStream", NS, "events") or {}).get("status", {}).get("archive"),
        message="the archive's status",
    )
    wait_for(
        lambda: (
            (c.get("DurableStream", NS, "events") or {})
            .get("status", {})
            .get("lastSuccessfulBackup")
        ),
        message="the last backup in the status",
    )
    shown = plugin(config, "status", "events")
    assert shown.returncode == 0, shown.stderr
    assert "Archive:      archiving to s3://bucket/events, lsn 42, 0 s behind" in shown.stdout
    assert f"({stand_in.backups[0]['id']}), recoverable from " in shown.stdout
    # A failed backup exits 1 with the operator's reason.
    stand_in.fail_next(503, "the store is down")
    failed = plugin(config, "backup", "events", "--target", "primary")
    assert failed.returncode == 1
    assert "the store is down" in failed.stdout


def test_backup_of_a_stream_without_an_archive_is_refused(kube):
    c, config, stand_in = kube
    one_server(c, {})
    refused = plugin(config, "backup", "events")
    assert refused.returncode == 1
    assert "no spec.backup" in refused.stderr
    assert not c.list("DurableStreamBackup", NS) and not stand_in.posts()
