"""The archive in a replica set of real server processes: only the primary archives,
under its term, after the term's history; a failover while the archive lags leaves
no gap and no duplicate (the new primary archives the old term's last frames from
its own WAL, then its own term)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from stream_format.archive import history_name
from testkit import wait_for
from testkit.archive_reads import archived_frames, status
from testkit.cluster import Cluster, cluster
from testkit.replica_set_processes import FAST, primary_with_standbys, start_member, until
from testkit.s3_faults import S3Faults
from testkit.seaweedfs import SeaweedFS, seaweed  # noqa: F401 - the fixture
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def api() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def append(srv: ServerProcess, body: bytes) -> int:
    r = httpx.post(srv.base + "r", content=body, headers={"content-type": "text/plain"}, timeout=60)
    return r.status_code


def test_only_the_primary_archives_and_a_failover_while_the_archive_lags_leaves_no_gap(
    seaweed: SeaweedFS,  # noqa: F811
    api: Cluster,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = seaweed.new_bucket()
    faults = S3Faults(seaweed.endpoint)
    try:
        args = ["--archive-url", url, "--archive-endpoint", faults.endpoint]
        servers = [
            start_member(
                server_factory, api, "arch", f"r{i}", timings=[*FAST, *args, "--archive-timeout", "0.3"],
                env=seaweed.env(),
            )
            for i in range(3)
        ]  # fmt: skip
        primary = primary_with_standbys(servers, 2)
        r = httpx.put(primary.base + "r", headers={"content-type": "text/plain"}, timeout=30)
        assert r.status_code in (200, 201)
        for i in range(10):
            assert append(primary, b"one-%d;" % i) in (200, 204)
        wait_for(
            lambda: status(primary.url)["lag_frames"] == 0, message=lambda: str(status(primary.url))
        )
        roles = sorted(status(s.url)["role"] for s in servers)
        assert roles == ["archiving", "standby", "standby"]
        first_term = status(primary.url)["archived_term"]
        assert first_term > 0
        # The store fails; the primary goes on acknowledging (async), then dies.
        faults.set("500")
        for i in range(10):
            assert append(primary, b"two-%d;" % i) in (200, 204)
        lagging = status(primary.url)
        assert lagging["lag_frames"] >= 10
        primary.kill()
        faults.set("pass")
        rest = [s for s in servers if s is not primary]
        new = primary_with_standbys(rest, 1)
        until("the new primary takes writes", lambda: append(new, b"three;") in (200, 204))
        wait_for(
            lambda: (d := status(new.url))["lag_frames"] == 0 and d["archived_lsn"] > 0,
            timeout=60,
            message=lambda: str(status(new.url)),
        )
        frames = archived_frames(seaweed.client(), url)
        lsns = [lsn for _, lsn, _ in frames]
        assert lsns == list(range(lsns[0], lsns[0] + len(lsns))), lsns
        terms = [t for t, _, _ in frames]
        assert terms == sorted(terms) and terms[0] == first_term and terms[-1] > first_term
        data = b"".join(f for _, _, f in frames)
        for body in [b"one-%d;" % i for i in range(10)] + [b"two-%d;" % i for i in range(10)]:
            assert body in data  # acknowledged before the failover: archived
        bucket = url[len("s3://") :]
        new_term = terms[-1]
        doc = json.loads(
            seaweed.client().get_object(Bucket=bucket, Key=history_name(new_term))["Body"].read()
        )
        assert doc["history"][0][0] == first_term and doc["history"][-1][0] == new_term
    finally:
        faults.close()
