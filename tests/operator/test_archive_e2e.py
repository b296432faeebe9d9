"""The operator's archive features end to end: the real kopf operator on the emulated
API server, each pod a real server process (testkit.kubelet), the archive a real
SeaweedFS bucket reached with the credentials of a Secret the pods' env names. A base
backup through a DurableStreamBackup, the archive in the DurableStream's status, and a
second DurableStream bootstrapped from that bucket by its restore init container."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.operated_archive import (
    NS,
    Pods,
    append,
    archived_all,
    condition,
    create,
    credentials_secret,
    object_store,
    ready_url,
    status_of,
    take_backup,
)
from testkit.operator import running_operator
from testkit.seaweedfs import SeaweedFS
from testkit.stream_reads import read_all

pytestmark = pytest.mark.processes

PATHS = ["a", "b/c", "big"]


@pytest.fixture
def kube() -> Iterator[tuple[Cluster, Pods]]:
    from stream_operator import replica_set  # after testkit.operator's settings

    pods = Pods()
    with cluster() as c:
        replica_set.use_pod_urls(pods.pod_url)
        try:
            with running_operator(c):
                credentials_secret(c)
                yield c, pods
        finally:
            replica_set.use_pod_urls(None)


def backed_up_spec(seaweed: SeaweedFS, destination: str) -> dict[str, Any]:
    return {"backup": {"objectStore": object_store(seaweed, destination), "archiveTimeout": 0.5}}


def write_before(url: str) -> None:
    create(url, "a", b"before the backup ")
    create(url, "b/c", b"x" * 5000)
    create(url, "big", bytes(range(256)) * 2000)


def write_after(url: str) -> None:
    for path in PATHS:
        r = append(url, path, f"after the backup: {path} ".encode())
        assert r.status_code in (200, 204), (r.status_code, r.text)


def test_a_backup_of_a_single_server_lands_in_the_bucket_and_in_the_status(
    kube: tuple[Cluster, Pods], seaweed: SeaweedFS, tmp_path: Path
):
    c, pods = kube
    bucket = seaweed.new_bucket()
    c.create(durable_stream("events", backed_up_spec(seaweed, bucket + "/events")))
    wait_for(lambda: c.get("StatefulSet", NS, "events"), message="the StatefulSet")
    with Kubelet(c, NS, "events", tmp_path / "events", restart_delay=0.5) as kubelet:
        pods.kubelets["events"] = kubelet
        url = ready_url(c, kubelet, "events")
        write_before(url)
        first = archived_all(url)
        wait_for(
            lambda: (
                (status_of(c, "events").get("archive") or {}).get("lastArchivedLSN", 0) >= first
            ),
            message=lambda: f"the archive in the status: {status_of(c, 'events')}",
        )
        assert condition(c, "events", "ContinuousArchiving")["status"] == "True"

        done = take_backup(c, "events", "first")
        assert done["phase"] == "completed", done
        assert done["pod"] == "events-0"
        assert done["backupID"] and 0 < done["beginLSN"] <= done["endLSN"]
        assert done["endLSN"] >= first
        key = f"events/backups/{done['backupID']}/manifest.json"
        body = seaweed.client().get_object(Bucket=bucket[len("s3://") :], Key=key)["Body"]
        manifest = json.loads(body.read())
        assert (manifest["start_lsn"], manifest["end_lsn"]) == (done["beginLSN"], done["endLSN"])
        wait_for(
            lambda: status_of(c, "events").get("lastSuccessfulBackupID") == done["backupID"],
            message=lambda: f"lastSuccessfulBackup: {status_of(c, 'events')}",
        )
        assert status_of(c, "events")["lastSuccessfulBackup"] == done["stoppedAt"]

        write_after(url)
        after = archived_all(url)
        assert after > done["endLSN"]
        wait_for(
            lambda: (
                (status_of(c, "events").get("archive") or {}).get("lastArchivedLSN", 0) >= after
            ),
            message=lambda: f"lastArchivedLSN advancing: {status_of(c, 'events')}",
        )
        assert condition(c, "events", "ContinuousArchiving")["status"] == "True"


def test_a_durable_stream_bootstrapped_from_the_bucket_serves_the_sources_streams(
    kube: tuple[Cluster, Pods], seaweed: SeaweedFS, tmp_path: Path
):
    c, pods = kube
    bucket = seaweed.new_bucket()
    c.create(durable_stream("events", backed_up_spec(seaweed, bucket + "/events")))
    wait_for(lambda: c.get("StatefulSet", NS, "events"), message="the StatefulSet")
    with Kubelet(c, NS, "events", tmp_path / "events", restart_delay=0.5) as source:
        pods.kubelets["events"] = source
        url = ready_url(c, source, "events")
        write_before(url)
        assert take_backup(c, "events", "first")["phase"] == "completed"
        write_after(url)
        archived_all(url)
        want = {path: read_all(f"{url}/v1/stream/{path}") for path in PATHS}

        recovery = {"recovery": {"source": object_store(seaweed, bucket + "/events")}}
        c.create(durable_stream("restored", {"bootstrap": recovery}))
        wait_for(lambda: c.get("StatefulSet", NS, "restored"), message="the StatefulSet")
        with Kubelet(c, NS, "restored", tmp_path / "restored", restart_delay=0.5) as kubelet:
            pods.kubelets["restored"] = kubelet
            restored = ready_url(c, kubelet, "restored")
            for path in PATHS:
                assert read_all(f"{restored}/v1/stream/{path}") == want[path], path
            pod = c.get("Pod", NS, "restored-0")
            inits = pod["status"]["initContainerStatuses"]
            assert [s["state"] for s in inits] == [
                {"terminated": {"exitCode": 0, "reason": "Completed"}}
            ]
            # The restored set is a set of its own: it takes writes.
            r = append(restored, "a", b"written after the restore")
            assert r.status_code in (200, 204), (r.status_code, r.text)
