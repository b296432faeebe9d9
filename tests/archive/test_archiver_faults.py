"""The archive's faults: the store down, answering 500, slow; wrong credentials; the
required mode; the pending bound. Appends go on (or are refused as documented), the
status says what is wrong, and the archive catches up once the store is back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from testkit import wait_for
from testkit.archive_reads import archived_frames, status
from testkit.s3_faults import S3Faults
from testkit.seaweedfs import SeaweedFS
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.processes


@pytest.fixture
def faults(seaweed: SeaweedFS) -> Iterator[S3Faults]:
    proxy = S3Faults(seaweed.endpoint)
    yield proxy
    proxy.close()


def start(
    factory: Callable[..., ServerProcess], url: str, endpoint: str, env: dict[str, str], *extra: str
) -> ServerProcess:
    args = ["--archive-url", url, "--archive-endpoint", endpoint, "--archive-timeout", "0.3"]
    srv = factory(*args, *extra, env=env).start()
    r = httpx.put(srv.base + "s", headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code in (200, 201), r.text
    return srv


def append(srv: ServerProcess, body: bytes = b"x;") -> httpx.Response:
    return httpx.post(
        srv.base + "s", content=body, headers={"content-type": "text/plain"}, timeout=90
    )


def caught_up(srv: ServerProcess) -> bool:
    doc = status(srv.url)
    return not doc["failing"] and doc["lag_frames"] == 0 and doc["archived_lsn"] > 0


def check_archive(seaweed: SeaweedFS, url: str, srv: ServerProcess) -> None:
    lsns = [lsn for _, lsn, _ in archived_frames(seaweed.client(), url)]
    assert lsns == list(range(1, status(srv.url)["durable_lsn"] + 1))


@pytest.mark.parametrize("fault", ["down", "500", "stall"])
def test_appends_go_on_while_the_store_fails_and_the_archive_catches_up(
    fault: str,
    seaweed: SeaweedFS,
    faults: S3Faults,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = seaweed.new_bucket()
    srv = start(server_factory, url, faults.endpoint, seaweed.env())
    assert append(srv).status_code in (200, 204)
    wait_for(lambda: caught_up(srv), message=lambda: str(status(srv.url)))
    if fault == "down":
        seaweed.stop()
    else:
        faults.set(fault)
    for _ in range(5):
        assert append(srv).status_code in (200, 204)
    if fault == "stall":  # nothing fails: the lag grows
        wait_for(lambda: status(srv.url)["lag_seconds"] > 0, message=lambda: str(status(srv.url)))
    else:
        doc = wait_for(
            lambda: (d := status(srv.url))["failing"] and d, message=lambda: str(status(srv.url))
        )
        assert doc["last_error_kind"] == "unavailable" and doc["lag_frames"] >= 5
    if fault == "down":
        seaweed.start()
    faults.set("pass")
    wait_for(lambda: caught_up(srv), timeout=90, message=lambda: str(status(srv.url)))
    check_archive(seaweed, url, srv)


def test_wrong_credentials_are_a_condition_not_a_storm(
    seaweed: SeaweedFS,
    faults: S3Faults,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = seaweed.new_bucket()
    env = seaweed.env(AWS_SECRET_ACCESS_KEY="wrong-secret")
    srv = start(server_factory, url, faults.endpoint, env)
    doc = wait_for(
        lambda: (d := status(srv.url))["failing"] and d, message=lambda: str(status(srv.url))
    )
    assert doc["last_error_kind"] == "denied"
    assert "wrong-secret" not in str(doc)
    seen = faults.requests
    for _ in range(30):  # each batch wakes the archiver: none may cut its slow retry short
        assert append(srv).status_code in (200, 204)
    assert status(srv.url)["lag_frames"] >= 30
    assert faults.requests - seen <= 4, faults.requests - seen  # at most one more attempt


def test_required_mode_acknowledges_only_archived_writes(
    seaweed: SeaweedFS,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = seaweed.new_bucket()
    srv = start(server_factory, url, seaweed.endpoint, seaweed.env(), "--archive-mode", "required")
    assert append(srv, b"first;").status_code in (200, 204)
    assert status(srv.url)["archived_lsn"] == status(srv.url)["durable_lsn"]
    seaweed.pause()
    answer: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answer.append(append(srv, b"second;")))
    try:
        t.start()
        wait_for(lambda: status(srv.url)["lag_frames"] >= 1, message=lambda: str(status(srv.url)))
        assert not answer  # durable here, not archived: not acknowledged
    finally:
        seaweed.resume()
    t.join()
    assert answer[0].status_code in (200, 204), answer[0].text
    assert status(srv.url)["archived_lsn"] >= status(srv.url)["durable_lsn"] - 0
    check_archive(seaweed, url, srv)


def test_the_pending_bound_refuses_writes_until_the_archive_catches_up(
    seaweed: SeaweedFS,
    faults: S3Faults,
    server_factory: Callable[..., ServerProcess],
) -> None:
    url = seaweed.new_bucket()
    srv = start(
        server_factory,
        url,
        faults.endpoint,
        seaweed.env(),
        "--archive-max-pending-bytes",
        "1048576",
    )
    faults.set("500")

    def refused() -> httpx.Response | None:
        r = append(srv, b"y" * 65536)
        return r if r.status_code == 503 else None

    r = wait_for(refused, message=lambda: str(status(srv.url)))
    assert "archive behind" in r.text and r.headers["retry-after"]
    assert r.headers.get_list("content-type") == ["text/plain; charset=utf-8"]  # once
    faults.set("pass")
    wait_for(
        lambda: append(srv).status_code in (200, 204),
        timeout=90,
        message=lambda: str(status(srv.url)),
    )
    wait_for(lambda: caught_up(srv), timeout=90, message=lambda: str(status(srv.url)))
    check_archive(seaweed, url, srv)
