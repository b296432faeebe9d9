"""The disaster-recovery drill's source as a replica set (test_dr_drill.py has a single
node): a replica cluster started from the set's base backup keeps following through a
failover at the source (the primary killed, a standby elected under a new term that
archives after the old term's last frame) and through its own restart, and serves
every append acknowledged before and after the failover. Real server processes, the
emulated API server's Lease, a real object store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit import wait_for
from testkit.archive_follow import POLL, follower, read
from testkit.archive_reads import status
from testkit.archive_store import S3Store, server_args
from testkit.cluster import Cluster, cluster
from testkit.replica_set_processes import FAST, primary_with_standbys, start_member, until
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.processes

TEXT = {"content-type": "text/plain"}


@pytest.fixture(scope="module")
def api() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def append(srv: ServerProcess, body: bytes) -> bool:
    r = httpx.post(srv.base + "s", content=body, headers=TEXT, timeout=60)
    return r.status_code in (200, 204)


def archived_all(srv: ServerProcess) -> dict[str, Any]:
    """The primary's archive status once it holds every frame the primary made durable."""

    def holds_all() -> dict[str, Any] | None:
        doc = status(srv.url)
        return doc if doc["lag_frames"] == 0 and doc["archived_lsn"] else None

    found: dict[str, Any] = wait_for(holds_all, timeout=60, message=lambda: str(status(srv.url)))
    return found


def serves(fol: ServerProcess, want: bytes) -> bool:
    return read(fol, "s")[:2] == (200, want)


def test_a_replica_cluster_follows_its_replicated_source_through_a_failover(
    archive_store: S3Store, api: Cluster, server_factory: Any, tmp_path: Path
) -> None:
    url = archive_store.new_bucket() + "/source"
    archiving = [*FAST, *server_args(archive_store, url), "--archive-timeout", POLL]
    servers = [
        start_member(server_factory, api, "dr", f"r{i}", timings=archiving, env=archive_store.env())
        for i in range(3)
    ]
    primary = primary_with_standbys(servers, 2)
    assert httpx.put(primary.base + "s", headers=TEXT, timeout=30).status_code in (200, 201)
    acked = b""
    for i in range(5):
        assert append(primary, b"before-%d;" % i)
        acked += b"before-%d;" % i
    backup = httpx.post(f"{primary.url}/_archive/backups", timeout=120)
    assert backup.status_code == 201, backup.text
    first_term = archived_all(primary)["archived_term"]

    fol = follower(server_factory, tmp_path, archive_store, url)
    wait_for(lambda: serves(fol, acked), timeout=60, message=lambda: fol.log()[-2000:])
    assert f"restored {url}" in fol.log()  # from the set's base backup

    primary.kill()
    rest = [s for s in servers if s is not primary]
    new = primary_with_standbys(rest, 1)
    until("the new primary takes writes", lambda: append(new, b"after-0;"))
    acked += b"after-0;"
    for i in range(1, 5):
        assert append(new, b"after-%d;" % i)
        acked += b"after-%d;" % i
    assert archived_all(new)["archived_term"] > first_term

    wait_for(lambda: serves(fol, acked), timeout=60, message=lambda: str(status(fol.url)))
    fol.stop()
    fol.start()  # its own restart, after the source's failover
    assert append(new, b"last;")
    acked += b"last;"
    archived_all(new)
    wait_for(lambda: serves(fol, acked), timeout=60, message=lambda: str(status(fol.url)))
    followed = status(fol.url)
    assert followed["failing"] is False and followed["source_term"] > first_term, followed
