"""The real kopf operator takes DurableStreamBackups, schedules them, and reports the
archive (emulated API server; the pods' archive endpoints played by a real loopback
HTTP server, testkit.archive_stand_in, answering the contract in docs/backup.md)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from stream_operator import KIND
from testkit import wait_for
from testkit.archive_stand_in import ArchiveStandIn, archive_stand_in
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.leases import replica_lease
from testkit.operator import running_operator
from testkit.operator_rbac import assert_role_grants_what_the_operator_did
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

pytestmark = pytest.mark.processes

NS = "default"
STORE = {"objectStore": {"destinationPath": "s3://bucket/events"}}


@pytest.fixture
def kube() -> Iterator[tuple[Cluster, ArchiveStandIn]]:
    from stream_operator.controllers import replica_set

    with cluster() as c, archive_stand_in() as stand_in:
        replica_set.use_pod_urls(stand_in.url)
        try:
            with running_operator(c):
                yield c, stand_in
        finally:
            replica_set.use_pod_urls(None)
    assert_role_grants_what_the_operator_did(c)


def ready_set(c: Cluster, spec: dict[str, Any], in_sync: list[str] | None = None) -> None:
    """``events`` created and played up: its pods ready, a replica set's Lease held by
    events-0 with ``in_sync`` standbys."""
    c.create(durable_stream("events", spec)).raise_for_status()
    wait_for(lambda: c.get("StatefulSet", NS, "events"), message="the StatefulSet")
    sts = c.get("StatefulSet", NS, "events")
    want = sts["spec"]["replicas"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    for i in range(want):
        c.create(pod_object(sts, i)).raise_for_status()
        ready = {"status": pod_status(container, ready=True, restarts=0)}
        c.patch("Pod", NS, f"events-{i}", ready, status=True).raise_for_status()
    if want > 1:
        c.create(replica_lease("events", NS, "events-0", 1, in_sync or [])).raise_for_status()
    claim_volumes(c, sts)
    rev = f"events-{sts['metadata']['generation']}"
    status = statefulset_status(sts, want, want, want, rev, rev)
    c.patch("StatefulSet", NS, "events", {"status": status}, status=True).raise_for_status()


def backup(c: Cluster, name: str, **spec: str) -> dict[str, Any]:
    body = {
        "apiVersion": "streams.pyds.dev/v1alpha1",
        "kind": "DurableStreamBackup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"cluster": "events", **spec},
    }
    c.create(body).raise_for_status()
    return wait_for(
        lambda: (
            (c.get("DurableStreamBackup", NS, name) or {}).get("status", {}).get("phase")
            in ("completed", "failed")
            and c.get("DurableStreamBackup", NS, name)["status"]
        ),
        message=f"backup {name} finished",
    )


def events(c: Cluster, name: str, reason: str) -> list[str]:
    return [
        e["message"]
        for e in c.list("Event", NS)
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


def ds_status(c: Cluster) -> dict[str, Any]:
    return (c.get(KIND, NS, "events") or {}).get("status") or {}


def condition(c: Cluster, ctype: str) -> dict[str, Any]:
    return next((x for x in ds_status(c).get("conditions") or [] if x["type"] == ctype), {})


def test_a_backup_runs_on_an_in_sync_standby_with_the_peer_token(kube):
    c, stand_in = kube
    ready_set(c, {"replicas": 3, "backup": STORE}, in_sync=["events-2"])
    secret = c.get("Secret", NS, "events-replication")
    stand_in.token = base64.b64decode(secret["data"]["token"]).decode()
    done = backup(c, "first")
    assert done["phase"] == "completed", done
    assert done["pod"] == "events-2"  # in sync; events-1 is not
    assert done["backupID"] == stand_in.backups[0]["id"]
    assert (done["beginLSN"], done["endLSN"]) == (10, 15)
    assert done["startedAt"] and done["stoppedAt"]
    assert stand_in.posts() == [("events-2", f"Bearer {stand_in.token}")]
    c.wait_for_event(NS, "first", "Completed")  # created after the status
    wait_for(lambda: ds_status(c).get("lastSuccessfulBackup") == done["stoppedAt"], message="ds")
    assert ds_status(c)["firstRecoverabilityPoint"] == stand_in.backups[0]["time"]
    # target: primary goes to the Lease holder.
    assert backup(c, "on-primary", target="primary")["pod"] == "events-0"


def test_a_refused_backup_fails_with_the_servers_reason_and_is_not_retried(kube):
    c, stand_in = kube
    ready_set(c, {"backup": STORE})
    stand_in.fail_next(503, "object store unavailable: connection refused")
    done = backup(c, "refused")
    assert done["phase"] == "failed"
    assert "503" in done["error"] and "connection refused" in done["error"]
    c.wait_for_event(NS, "refused", "Failed")
    assert stand_in.posts() == [("events-0", "")]  # a single server: no token
    # Not retried: the next backup is a new object.
    assert backup(c, "again")["phase"] == "completed"
    assert len(stand_in.posts()) == 2


def test_a_backup_of_a_cluster_without_an_archive_fails_at_once(kube):
    c, stand_in = kube
    ready_set(c, {})
    done = backup(c, "nowhere")
    assert done["phase"] == "failed" and "no spec.backup" in done["error"]
    assert stand_in.posts() == []


def test_the_schedule_creates_owned_backups_that_are_taken(kube):
    c, _ = kube
    ready_set(c, {"backup": {**STORE, "schedule": "* * * * * *"}})
    taken = wait_for(
        lambda: [
            b
            for b in c.list("DurableStreamBackup", NS)
            if (b.get("status") or {}).get("phase") == "completed"
        ],
        message="a scheduled backup completed",
    )
    owner = taken[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == (KIND, "events")
    assert taken[0]["metadata"]["name"].startswith("events-2")  # named for its time
    assert ds_status(c)["nextScheduledBackup"] > ds_status(c)["lastScheduledBackup"]
    c.wait_for_event(NS, "events", "BackupScheduled")


def test_archive_status_condition_and_events_follow_the_primary(kube):
    c, stand_in = kube
    ready_set(c, {"backup": STORE})
    wait_for(lambda: condition(c, "ContinuousArchiving").get("status") == "True", message="ok")
    assert ds_status(c)["archive"]["lastArchivedLSN"] == 42
    stand_in.set_status(
        failing=True, last_error="403 AccessDenied", last_error_kind="denied", lag_seconds=31.6
    )
    wait_for(
        lambda: condition(c, "ContinuousArchiving").get("reason") == "ArchiveDenied",
        message="the archive failing",
    )
    assert ds_status(c)["archive"]["failing"] is True
    assert ds_status(c)["archive"]["lagSeconds"] == 32
    c.wait_for_event(NS, "events", "ArchiveFailing")
    assert events(c, "events", "ArchiveFailing") == ["ArchiveDenied: 403 AccessDenied"]
    stand_in.set_status(archived_lsn=50)
    wait_for(lambda: events(c, "events", "ArchiveRecovered"), message="recovered")
    wait_for(lambda: ds_status(c)["archive"]["lastArchivedLSN"] == 50, message="caught up")
    assert len(events(c, "events", "ArchiveFailing")) == 1
    assert {p for p, verb, path, _ in stand_in.calls if path == "/_archive/status"} == {"events-0"}


def test_a_backup_cut_off_by_an_operator_restart_is_failed_saying_so():
    """Found running when the operator starts: its outcome is unknown, never taken twice."""
    from stream_operator.controllers import replica_set

    with cluster() as c, archive_stand_in() as stand_in:
        body = {
            "apiVersion": "streams.pyds.dev/v1alpha1",
            "kind": "DurableStreamBackup",
            "metadata": {"name": "cut", "namespace": NS},
            "spec": {"cluster": "events"},
        }
        c.create(body).raise_for_status()
        running = {"status": {"phase": "running", "pod": "events-0"}}
        c.patch("DurableStreamBackup", NS, "cut", running, status=True).raise_for_status()
        replica_set.use_pod_urls(stand_in.url)
        try:
            with running_operator(c):
                done = wait_for(
                    lambda: (
                        (c.get("DurableStreamBackup", NS, "cut") or {})
                        .get("status", {})
                        .get("phase")
                        == "failed"
                        and c.get("DurableStreamBackup", NS, "cut")["status"]
                    ),
                    message="the cut-off backup failed",
                )
        finally:
            replica_set.use_pod_urls(None)
    assert "restarted" in done["error"] and done["pod"] == "events-0"
    assert stand_in.posts() == []


def test_a_replica_cluster_reports_following_and_takes_no_backup(kube):
    c, stand_in = kube
    source = {"destinationPath": "s3://bucket/source"}
    stand_in.set_status(role="following", archived_lsn=77, lag_seconds=3.2)
    ready_set(c, {"replicas": 2, "replica": {"enabled": True, "source": source}})
    wait_for(
        lambda: condition(c, "ContinuousArchiving").get("reason") == "FollowingSource",
        message="following",
    )
    assert "lsn 77, 3 s behind the source" in condition(c, "ContinuousArchiving")["message"]
    assert ds_status(c)["archive"]["role"] == "following"
    done = backup(c, "of-a-replica")
    assert done["phase"] == "failed" and "replica cluster" in done["error"]
    assert stand_in.posts() == []
