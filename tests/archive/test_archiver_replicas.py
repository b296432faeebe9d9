"""The archive in a replica set of real server processes: only the primary archives,
under its term, after the term's history; a failover while the archive lags leaves
no gap and no duplicate (the new primary archives the old term's last frames from
its own WAL, then its own term)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from stream_format.archive import history_name, history_ranges
from testkit import wait_for
from testkit.archive_reads import archived_frames, status
from testkit.archive_store import S3Store
from testkit.cluster import Cluster, cluster
from testkit.replica_set_processes import FAST, primary_with_standbys, start_member, until
from testkit.s3_faults import S3Faults
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
    archive_store: S3Store,
    api: Cluster,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = archive_store.new_bucket()
    faults = S3Faults(archive_store.endpoint)
    try:
        args = ["--archive-url", url, "--archive-endpoint", faults.endpoint]
        servers = [
            start_member(
                server_factory, api, "arch", f"r{i}", timings=[*FAST, *args, "--archive-timeout", "0.3"],
                env=archive_store.env(),
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
        frames = archived_frames(archive_store.client(), url)
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
            archive_store.client()
            .get_object(Bucket=bucket, Key=history_name(new_term))["Body"]
            .read()
        )
        assert doc["history"][0][0] == first_term and doc["history"][-1][0] == new_term
    finally:
        faults.close()


def test_a_new_primary_archives_along_its_history_past_a_deposed_primarys_frames(
    archive_store: S3Store,
    api: Cluster,
    server_factory: Callable[..., ServerProcess],
) -> None:
    """The primary archives a frame its standbys never got (they are down), then
    dies; the new primary's term begins at that frame's lsn. It must archive its own
    term from there (not take the archive for ahead of it, not skip to the end of the
    deposed primary's frames), and a restore's walk along its history finds every
    frame once."""
    url = archive_store.new_bucket()
    args = [
        "--archive-url",
        url,
        "--archive-endpoint",
        archive_store.endpoint,
        "--archive-timeout",
        "0.2",
    ]
    servers = [
        start_member(
            server_factory, api, "ahead", f"r{i}", timings=[*FAST, *args], env=archive_store.env()
        )
        for i in range(3)
    ]
    primary = primary_with_standbys(servers, 2)
    r = httpx.put(primary.base + "r", headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code in (200, 201)
    assert append(primary, b"kept;") in (200, 204)
    rest = [s for s in servers if s is not primary]
    wait_for(
        lambda: all(
            status(s.url)["durable_lsn"] == status(primary.url)["durable_lsn"] for s in rest
        )
    )
    standby_lsn = status_lsn(rest[0])
    for s in rest:
        s.kill()
    lost = threading.Thread(target=lambda: _quietly(lambda: append(primary, b"lost;")))
    try:
        lost.start()
        wait_for(
            lambda: (
                (d := status(primary.url))["archived_lsn"] == d["durable_lsn"]
                and d["durable_lsn"] > standby_lsn
            ),
            message=lambda: str(status(primary.url)),
        )
        primary.kill()
    finally:
        for s in rest:
            s.start()
    lost.join()
    new = primary_with_standbys(rest, 1)
    until("the new primary takes writes", lambda: append(new, b"after;") in (200, 204))
    wait_for(
        lambda: (d := status(new.url))["lag_frames"] == 0 and d["archived_term"] > 0,
        message=lambda: str(status(new.url)),
    )
    metrics = httpx.get(f"{new.url}/metrics", timeout=10).text
    assert 'durable_streams_archive_failures_total{kind="damaged"} 0.0' in metrics, metrics
    doc = status(new.url)
    bucket = url[len("s3://") :]
    history_doc = json.loads(
        archive_store.client()
        .get_object(Bucket=bucket, Key=history_name(doc["archived_term"]))["Body"]
        .read()
    )
    held = {(t, lsn): f for t, lsn, f in archived_frames(archive_store.client(), url)}
    walked = [
        (term, lsn)
        for term, first, last in history_ranges(
            [(t, f) for t, f in history_doc["history"]], doc["durable_lsn"]
        )
        for lsn in range(first, last + 1)
    ]
    missing = [key for key in walked if key not in held]
    assert not missing, missing
    data = b"".join(held[key] for key in walked)
    assert b"kept;" in data and b"after;" in data, (walked, sorted(held))
    assert b"lost;" not in data, (walked, sorted(held))
    assert b"lost;" in b"".join(held.values())  # the deposed primary did archive it


def status_lsn(srv: ServerProcess) -> int:
    lsn: int = status(srv.url)["durable_lsn"]
    return lsn


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the primary is killed under it
        call()
