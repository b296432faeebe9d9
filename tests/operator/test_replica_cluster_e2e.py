"""Promotion and demotion of replica clusters end to end: the real kopf operator on the
emulated API server, each pod a real server process (testkit.kubelet), the archives in
a real SeaweedFS, and the spec changes made by ``kubectl dstream promote`` and
``demote`` in processes of their own.

A source set archives; a replica cluster follows it; the replica cluster is promoted
(it takes writes, says Promoted, with its Events); the former source is demoted into a
follower of the promoted set's archive: first refused (its volumes hold its own history),
then rebuilt from the promoted set's base backup, after which it serves what was written
on the promoted set and refuses writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kubectl_plugin import kubeconfig, plugin_process
from testkit.operated_archive import (
    NS,
    Pods,
    append,
    archived_all,
    backed_up_spec,
    condition,
    create,
    object_store,
    operated_with_pods,
    ready_url,
    status_of,
    take_backup,
)
from testkit.seaweedfs import SeaweedFS
from testkit.stream_reads import read_all, read_served

pytestmark = pytest.mark.processes


@pytest.fixture
def kube() -> Iterator[tuple[Cluster, Pods]]:
    with operated_with_pods() as both:
        yield both


def served(url: str | None, path: str) -> bytes | None:
    if url is None:
        return None
    try:
        with httpx.Client(timeout=10) as client:
            return read_served(client, f"{url}/v1/stream/{path}")
    except httpx.HTTPError:
        return None


def reason_is(c: Cluster, name: str, reason: str) -> bool:
    return condition(c, name, "ReplicaCluster").get("reason") == reason


def wait_reason(c: Cluster, name: str, reason: str, timeout: float = 120) -> dict[str, Any]:
    wait_for(
        lambda: reason_is(c, name, reason),
        timeout=timeout,
        message=lambda: f"{name} ReplicaCluster {reason}: {status_of(c, name)}",
    )
    return condition(c, name, "ReplicaCluster")


def test_promote_then_demote_the_former_source_with_refusal_then_rebuild(
    kube: tuple[Cluster, Pods], seaweed: SeaweedFS, tmp_path: Path
):
    c, pods = kube
    config = kubeconfig(tmp_path / "kubeconfig", c.url, NS)
    bucket, own = seaweed.new_bucket(), seaweed.new_bucket()
    source_store = bucket + "/events"
    with pods.run(c, "events", backed_up_spec(seaweed, source_store), tmp_path) as source:
        url = ready_url(c, source, "events")
        create(url, "a", b"on the source ")
        assert take_backup(c, "events", "first")["phase"] == "completed"
        assert append(url, "a", b"after its backup ").status_code in (200, 204)
        archived_all(url)
        assert condition(c, "events", "ReplicaCluster") == {}  # never followed

        dr_spec = backed_up_spec(seaweed, own + "/dr")
        dr_spec["replica"] = {"enabled": True, "source": object_store(seaweed, source_store)}
        with pods.run(c, "dr", dr_spec, tmp_path) as replica:
            follower = ready_url(c, replica, "dr")
            assert wait_reason(c, "dr", "FollowingSource")["status"] == "True"
            assert append(url, "a", b"followed ").status_code in (200, 204)
            want = read_all(f"{url}/v1/stream/a")
            wait_for(
                lambda: served(follower, "a") == want,
                timeout=60,
                message="the replica cluster serving the source's writes",
            )

            # Promotion: one spec change, made by the plugin.
            done = plugin_process(config, "promote", "dr")
            assert done.returncode == 0, done.stderr
            assert (c.get(KIND, NS, "dr") or {})["spec"]["replica"]["enabled"] is False
            # The status first (a round reading the real servers writes it), then its
            # Event: under load, the two together took longer than a single 20 s wait
            # allowed.
            wait_for(
                lambda: reason_is(c, "dr", "Promoting") or reason_is(c, "dr", "Promoted"),
                timeout=120,
                message=lambda: f"dr ReplicaCluster Promoting: {status_of(c, 'dr')}",
            )
            c.wait_for_event(NS, "dr", "Promoting", containing=own + "/dr")

            def takes_a_write() -> str | None:
                promoted = replica.url_of("dr-0")
                try:
                    r = append(promoted, "a", b"on the promoted set") if promoted else None
                except httpx.HTTPError:
                    return None
                return promoted if r is not None and r.status_code in (200, 204) else None

            promoted = wait_for(takes_a_write, timeout=120, message="the promoted set's write")
            assert read_all(f"{promoted}/v1/stream/a") == want + b"on the promoted set"
            promoted_cond = wait_reason(c, "dr", "Promoted")
            assert promoted_cond["status"] == "False" and own + "/dr" in promoted_cond["message"]
            c.wait_for_event(NS, "dr", "Promoted")
            archived_all(promoted)
            wait_for(lambda: replica.ready_pods(), timeout=60, message="dr-0 ready after promotion")
            assert take_backup(c, "dr", "after-promotion")["phase"] == "completed"
            final = read_all(f"{promoted}/v1/stream/a")

            # Demotion of the former source: it stops writing, and its volume (its own
            # history) is refused by default.
            done = plugin_process(config, "demote", "events", "--to", "dr")
            assert done.returncode == 0, done.stderr
            refused = wait_reason(c, "events", "DemotionRefused")
            assert refused["status"] == "False" and "demotionPolicy: Rebuild" in refused["message"]
            c.wait_for_event(NS, "events", "Demoting")
            c.wait_for_event(NS, "events", "DemotionRefused")
            assert source.url_of("events-0") is None  # stopped: it writes nothing
            assert c.get("PersistentVolumeClaim", NS, "data-events-0") is not None
            sts = c.get("StatefulSet", NS, "events") or {}
            assert sts["spec"]["replicas"] == 0

            # Rebuild: the claim goes, a new volume restores the promoted set's backup.
            rebuild = {"spec": {"replica": {"demotionPolicy": "Rebuild"}}}
            c.patch(KIND, NS, "events", rebuild).raise_for_status()
            c.wait_for_event(NS, "events", "VolumesDeleted", containing="data-events-0")
            log = tmp_path / "events" / "events-0.log"
            wait_for(
                lambda: f"restored {own}/dr up to lsn" in log.read_text(errors="replace"),
                timeout=120,
                message="the new volume restored from the promoted set's backup",
            )
            # The restored directory follows the promoted set's archive, although the
            # backup carries that set's promoted term (follow_position.resume).
            wait_for(
                lambda: reason_is(c, "events", "FollowingSource"),
                timeout=180,
                message=lambda: f"events following its new source: {status_of(c, 'events')}",
            )
            following = condition(c, "events", "ReplicaCluster")
            assert following["status"] == "True" and own + "/dr" in following["message"]
            c.wait_for_event(NS, "events", "Demoted")
            wait_for(
                lambda: served(source.url_of("events-0"), "a") == final,
                timeout=60,
                message="the demoted set serving what the promoted set wrote",
            )
            demoted = source.url_of("events-0")
            assert demoted is not None
            r = append(demoted, "a", b"refused")
            assert r.status_code == 503 and "read-only replica cluster" in r.text
