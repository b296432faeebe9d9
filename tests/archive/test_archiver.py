"""The continuous WAL archive against a real SeaweedFS and real server processes:
every acknowledged frame reaches the archive in order; kill -9 during uploads
leaves no gap and no duplicate."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest

from testkit import wait_for
from testkit.archive_reads import archived_frames, status, written_bytes
from testkit.archive_store import S3Store
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.processes


def archive_args(url: str, endpoint: str, *extra: str) -> list[str]:
    return [
        "--archive-url",
        url,
        "--archive-endpoint",
        endpoint,
        "--archive-timeout",
        "0.3",
        *extra,
    ]


def append(srv: ServerProcess, path: str, body: bytes) -> httpx.Response:
    return httpx.post(
        srv.base + path, content=body, headers={"content-type": "text/plain"}, timeout=60
    )


def create(srv: ServerProcess, path: str) -> None:
    r = httpx.put(srv.base + path, headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code in (200, 201), r.text


def caught_up(srv: ServerProcess) -> Callable[[], bool]:
    def check() -> bool:
        doc = status(srv.url)
        return doc["lag_frames"] == 0 and doc["archived_lsn"] == doc["durable_lsn"] > 0

    return check


def no_gap_no_duplicate(lsns: list[int]) -> None:
    assert lsns == list(range(lsns[0], lsns[0] + len(lsns))), lsns


def test_every_acknowledged_frame_reaches_the_archive_in_order(
    archive_store: S3Store,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = archive_store.new_bucket() + "/set-a"
    srv = server_factory(
        *archive_args(url, archive_store.endpoint), env=archive_store.env()
    ).start()
    create(srv, "s")
    sent = [b"m%03d;" % i for i in range(40)]
    for body in sent:
        assert append(srv, "s", body).status_code in (200, 204)
    wait_for(caught_up(srv), message=lambda: str(status(srv.url)))
    doc = status(srv.url)
    assert doc["enabled"] and doc["role"] == "archiving" and doc["url"] == url
    assert not doc["failing"] and doc["archived_term"] == 0
    frames = archived_frames(archive_store.client(), url)
    no_gap_no_duplicate([lsn for _, lsn, _ in frames])
    assert {t for t, _, _ in frames} == {0}
    data = written_bytes(frames)
    assert [data.index(b) for b in sent] == sorted(data.index(b) for b in sent)
    bucket = url[len("s3://") :].split("/")[0]
    key = "set-a/history/" + "0" * 16 + ".json"
    history = archive_store.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert b"[[0, 1]]" in history
    # A clean restart continues the lsns (a single node's WAL starts empty then).
    srv.stop()
    srv.start()
    for body in (b"after-1;", b"after-2;"):
        assert append(srv, "s", body).status_code in (200, 204)
    wait_for(caught_up(srv), message=lambda: str(status(srv.url)))
    frames = archived_frames(archive_store.client(), url)
    no_gap_no_duplicate([lsn for _, lsn, _ in frames])
    data = written_bytes(frames)
    assert data.index(sent[-1]) < data.index(b"after-1;") < data.index(b"after-2;")
    metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
    assert f"durable_streams_archive_archived_lsn {float(frames[-1][1])}" in metrics


def test_kill_9_during_uploads_leaves_no_gap_and_no_duplicate(
    archive_store: S3Store,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = archive_store.new_bucket()
    args = archive_args(url, archive_store.endpoint, "--archive-object-bytes", "4096")
    srv = server_factory(*args, env=archive_store.env()).start()
    create(srv, "k")
    acked: list[bytes] = []
    for round_ in range(3):
        stop = threading.Event()

        def writer(round_: int = round_, stop: threading.Event = stop) -> None:
            i = 0
            while not stop.is_set():
                body = b"r%d-%05d;" % (round_, i)
                try:
                    if append(srv, "k", body * 20).status_code in (200, 204):
                        acked.append(body * 20)
                except httpx.HTTPError:
                    return
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        wait_for(
            lambda: status(srv.url)["archived_lsn"] > len(acked) // 2 > 5,
            message=lambda: str(status(srv.url)),
        )
        srv.kill()
        stop.set()
        t.join()
        srv.start()
    wait_for(caught_up(srv), message=lambda: str(status(srv.url)))
    frames = archived_frames(archive_store.client(), url)
    no_gap_no_duplicate([lsn for _, lsn, _ in frames])
    data = written_bytes(frames)
    for body in acked:
        assert body in data


def test_a_clean_stop_uploads_what_the_archive_timeout_has_not_yet(
    archive_store: S3Store,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = archive_store.new_bucket()
    args = [
        "--archive-url",
        url,
        "--archive-endpoint",
        archive_store.endpoint,
        "--archive-timeout",
        "600",
    ]
    srv = server_factory(*args, env=archive_store.env()).start()
    create(srv, "c")
    for i in range(5):
        assert append(srv, "c", b"c%d;" % i).status_code in (200, 204)
    durable = status(srv.url)["durable_lsn"]
    assert status(srv.url)["archived_lsn"] == 0  # not due for ten minutes
    srv.stop()
    lsns = [lsn for _, lsn, _ in archived_frames(archive_store.client(), url)]
    assert lsns == list(range(1, durable + 1))
