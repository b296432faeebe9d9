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

import httpx
import pytest

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.kubelet import Kubelet
from testkit.operated_archive import (
    NS,
    Pods,
    append,
    archived_all,
    backed_up_spec,
    condition,
    create,
    credentials_secret,
    object_store,
    operated_with_pods,
    peer_token,
    ready_url,
    status_of,
    take_backup,
)
from testkit.operator import operated_api_server
from testkit.seaweedfs import SeaweedFS
from testkit.stream_reads import read_all, read_served

pytestmark = pytest.mark.processes

PATHS = ["a", "b/c", "big"]
# A replica set that elects in seconds (testkit.ledger's settings).
REPLICA_SET: dict[str, Any] = {
    "replicas": 3,
    "replication": {"leaseDurationSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
    "lifecycle": {"terminationGracePeriodSeconds": 10, "readinessPeriodSeconds": 1},
    # Plain HTTP: the kubelet stand-in reaches pods at 127.0.0.1, which the built-in CA's
    # certificate does not name (TLS over it: tests/replication/test_builtin_ca_set.py).
    "certificates": {"builtIn": False},
}


@pytest.fixture
def kube() -> Iterator[tuple[Cluster, Pods]]:
    with operated_with_pods() as both:
        yield both


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
    with pods.run(c, "events", backed_up_spec(seaweed, bucket + "/events"), tmp_path) as kubelet:
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
        # Recoverable from the backup's snapshot on (the server's backup list).
        assert status_of(c, "events")["firstRecoverabilityPoint"] == manifest["time"]

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
    with pods.run(c, "events", backed_up_spec(seaweed, bucket + "/events"), tmp_path) as source:
        url = ready_url(c, source, "events")
        write_before(url)
        assert take_backup(c, "events", "first")["phase"] == "completed"
        write_after(url)
        archived_all(url)
        want = {path: read_all(f"{url}/v1/stream/{path}") for path in PATHS}

        recovery = {"recovery": {"source": object_store(seaweed, bucket + "/events")}}
        with pods.run(c, "restored", {"bootstrap": recovery}, tmp_path) as kubelet:
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
            # A server that exits is restarted in its pod: the init containers do not
            # run again (they ran once for the pod).
            restore_log = tmp_path / "restored" / "restored-0-restore.log"
            logged = restore_log.read_bytes()
            kubelet.kill(0)
            wait_for(
                lambda: kubelet.pods[0].restarts == 1 and kubelet.pods[0].pod_ready,
                timeout=60,
                message="the server restarted in its pod",
            )
            assert restore_log.read_bytes() == logged
            assert read_all(f"{restored}/v1/stream/a") == want["a"] + b"written after the restore"


def test_a_replica_cluster_follows_the_source_refuses_writes_and_is_promoted(
    kube: tuple[Cluster, Pods], seaweed: SeaweedFS, tmp_path: Path
):
    c, pods = kube
    bucket, own = seaweed.new_bucket(), seaweed.new_bucket()
    with pods.run(c, "events", backed_up_spec(seaweed, bucket + "/events"), tmp_path) as source:
        url = ready_url(c, source, "events")
        write_before(url)
        assert take_backup(c, "events", "first")["phase"] == "completed"
        write_after(url)
        archived_all(url)

        spec = backed_up_spec(seaweed, own + "/replica")
        spec["replica"] = {"enabled": True, "source": object_store(seaweed, bucket + "/events")}
        with pods.run(c, "replica", spec, tmp_path) as kubelet:
            follower = ready_url(c, kubelet, "replica")
            for path in PATHS:
                want = read_all(f"{url}/v1/stream/{path}")
                wait_for(
                    lambda path=path, want=want: read_served_or_none(follower, path) == want,
                    message=f"the replica cluster serving {path} as the source does",
                )
            r = append(follower, "a", b"refused")
            assert r.status_code == 503, (r.status_code, r.text)
            assert "read-only replica cluster" in r.text
            wait_for(
                lambda: (
                    condition(c, "replica", "ContinuousArchiving").get("reason")
                    == "FollowingSource"
                ),
                message=lambda: f"FollowingSource: {status_of(c, 'replica')}",
            )
            assert take_backup(c, "replica", "refused")["phase"] == "failed"

            # More on the source: followed.
            r = append(url, "a", b"then more on the source")
            assert r.status_code in (200, 204), r.text
            want = read_all(f"{url}/v1/stream/a")
            wait_for(
                lambda: read_served_or_none(follower, "a") == want,
                timeout=60,
                message="the replica cluster following the source's new append",
            )

            # Promotion: its own archive, and writes.
            promote = {"spec": {"replica": {"enabled": False}}}
            c.patch(KIND, NS, "replica", promote).raise_for_status()

            def takes_a_write() -> str | None:
                promoted = kubelet.url_of("replica-0")
                if promoted is None:
                    return None
                try:
                    r = append(promoted, "a", b" promoted")
                except httpx.HTTPError:
                    return None
                return promoted if r.status_code in (200, 204) else None

            promoted = wait_for(
                takes_a_write, timeout=120, message="the promoted set takes a write"
            )
            assert read_all(f"{promoted}/v1/stream/a") == want + b" promoted"
            lsn = archived_all(promoted)
            wait_for(
                lambda: (
                    (status_of(c, "replica").get("archive") or {}).get("lastArchivedLSN", 0) >= lsn
                    and condition(c, "replica", "ContinuousArchiving").get("reason") == "Archiving"
                ),
                timeout=60,
                message=lambda: f"the promoted set archiving: {status_of(c, 'replica')}",
            )
            # A backup needs the pod ready (its readiness probe passed since the restart,
            # as the kubelet reports it to the API).
            wait_for(
                lambda: kubelet.ready_pods() and pod_ready(c, "replica-0"),
                timeout=60,
                message="replica-0 ready again",
            )
            own_backup = take_backup(c, "replica", "own")
            assert own_backup["phase"] == "completed", own_backup
            listed = seaweed.client().list_objects_v2(Bucket=own[len("s3://") :])
            assert any(o["Key"].endswith("manifest.json") for o in listed.get("Contents", []))


def read_served_or_none(url: str, path: str) -> bytes | None:
    try:
        with httpx.Client(timeout=10) as client:
            return read_served(client, f"{url}/v1/stream/{path}")
    except httpx.HTTPError:
        return None


def pod_ready(c: Cluster, name: str) -> bool:
    conds = ((c.get("Pod", NS, name) or {}).get("status") or {}).get("conditions") or []
    return any(x["type"] == "Ready" and x["status"] == "True" for x in conds)


def test_a_restore_waits_for_its_secret_and_is_retried_until_a_backup_exists(
    kube: tuple[Cluster, Pods], seaweed: SeaweedFS, tmp_path: Path
):
    """No credentials yet: the pod's containers are not made (CreateContainerConfigError).
    Then no backup in the bucket yet: the restore init container fails, the server does
    not start, the status says why, and the init container is run again after its
    back-off, until the backup exists and it restores that."""
    c, pods = kube
    bucket = seaweed.new_bucket()
    with pods.run(c, "events", backed_up_spec(seaweed, bucket + "/events"), tmp_path) as source:
        url = ready_url(c, source, "events")
        write_before(url)

        store = object_store(seaweed, bucket + "/events")
        for key in store["s3Credentials"].values():
            key["name"] = "restore-credentials"
        with pods.run(
            c, "restored", {"bootstrap": {"recovery": {"source": store}}}, tmp_path
        ) as kubelet:
            why = wait_for(
                lambda: kubelet.waiting.get("restored-0"), message="the container not made"
            )
            assert "CreateContainerConfigError" in why and "restore-credentials" in why
            assert not kubelet.pods
            credentials_secret(c, "restore-credentials")

            def failed_restore() -> dict[str, Any] | None:
                pod = c.get("Pod", NS, "restored-0") or {}
                for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
                    if (cs["state"].get("waiting") or {}).get("reason") == "CrashLoopBackOff":
                        return dict(cs)
                return None

            failed = wait_for(failed_restore, timeout=60, message="the restore failing")
            assert failed["lastState"]["terminated"]["exitCode"] != 0
            assert kubelet.url_of("restored-0") is None
            wait_for(  # a status round after the failure: generous on a loaded machine
                lambda: "restore" in condition(c, "restored", "Ready").get("message", ""),
                timeout=60,
                message=lambda: f"the status saying why: {status_of(c, 'restored')}",
            )

            assert take_backup(c, "events", "first")["phase"] == "completed"
            archived_all(url)
            want = {path: read_all(f"{url}/v1/stream/{path}") for path in PATHS}
            restored = ready_url(c, kubelet, "restored")
            for path in PATHS:
                assert read_all(f"{restored}/v1/stream/{path}") == want[path], path
            assert kubelet.pods[0].init_restarts >= 1


def test_a_replica_sets_backup_is_taken_on_an_in_sync_standby(seaweed: SeaweedFS, tmp_path: Path):
    """Three servers electing their primary through the Lease; the backup goes to an
    in-sync standby (prefer-standby), holds every acknowledged append, and the primary
    archives."""
    from stream_operator.controllers import replica_set

    bucket = seaweed.new_bucket()
    spec = {**REPLICA_SET, **backed_up_spec(seaweed, bucket + "/ledger")}
    with operated_api_server(tmp_path) as c:
        credentials_secret(c)
        c.create(durable_stream("ledger", spec)).raise_for_status()
        wait_for(lambda: c.get("StatefulSet", NS, "ledger"), message="the StatefulSet")
        with Kubelet(c, NS, "ledger", tmp_path / "ledger", restart_delay=1.0) as kubelet:
            replica_set.use_pod_urls(kubelet.pod_url)
            st = wait_for(
                lambda: (
                    status_of(c, "ledger").get("inSyncReplicas") == 3
                    and status_of(c, "ledger").get("phase") == "Ready"
                    and status_of(c, "ledger")
                ),
                timeout=180,
                message=lambda: f"three in sync: {status_of(c, 'ledger')}",
            )
            primary = kubelet.url_of(st["primary"])
            assert primary is not None
            write_before(primary)
            write_after(primary)
            lsn = archived_all(primary, peer_token(c, "ledger"))
            wait_for(
                lambda: (
                    (status_of(c, "ledger").get("archive") or {}).get("lastArchivedLSN", 0) >= lsn
                ),
                message=lambda: f"the primary's archive in the status: {status_of(c, 'ledger')}",
            )
            assert status_of(c, "ledger")["archive"]["role"] == "archiving"
            done = take_backup(c, "ledger", "on-standby")
            assert done["phase"] == "completed", done
            assert done["pod"] != st["primary"] and done["pod"].startswith("ledger-"), done
            assert done["pod"] != status_of(c, "ledger")["primary"]
            assert done["endLSN"] >= lsn  # every acknowledged append is in it
            key = f"ledger/backups/{done['backupID']}/manifest.json"
            body = seaweed.client().get_object(Bucket=bucket[len("s3://") :], Key=key)["Body"]
            assert json.loads(body.read())["end_lsn"] == done["endLSN"]


def test_a_replica_set_bootstrapped_from_the_bucket_serves_the_restored_streams(
    seaweed: SeaweedFS, tmp_path: Path
):
    """Three pods, only the first restores (its init container; the others' exit at
    once): whichever is elected, the set serves the restored streams on every pod."""
    from stream_operator.controllers import replica_set

    bucket = seaweed.new_bucket()
    with operated_api_server(tmp_path) as c:
        credentials_secret(c)
        pods = Pods()
        replica_set.use_pod_urls(pods.pod_url)
        with pods.run(c, "events", backed_up_spec(seaweed, bucket + "/events"), tmp_path) as source:
            url = ready_url(c, source, "events")
            write_before(url)
            assert take_backup(c, "events", "first")["phase"] == "completed"
            write_after(url)
            archived_all(url)
            want = {path: read_all(f"{url}/v1/stream/{path}") for path in PATHS}

        recovery = {"recovery": {"source": object_store(seaweed, bucket + "/events")}}
        with pods.run(
            c, "ledger", {**REPLICA_SET, "bootstrap": recovery}, tmp_path, restart_delay=1.0
        ) as kubelet:
            st = wait_for(
                lambda: (
                    status_of(c, "ledger").get("inSyncReplicas") == 3
                    and status_of(c, "ledger").get("phase") == "Ready"
                    and status_of(c, "ledger")
                ),
                timeout=180,
                message=lambda: f"three in sync: {status_of(c, 'ledger')}",
            )
            for pod in ("ledger-0", "ledger-1", "ledger-2"):
                served = kubelet.url_of(pod)
                assert served is not None
                for path in PATHS:
                    got = read_served_or_none(served, path)
                    assert got == want[path], (pod, st["primary"], path, got and len(got))
