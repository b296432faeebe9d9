"""Large catch-up reads against the real server (in-process): one response, streamed in 4 MiB chunks.

The bytes, the end offset, the length, the ETag and the follow-up reads must
be exactly what a reader of smaller responses would get.
"""

from __future__ import annotations

import os

import httpx
import pytest

from testkit.asgi import in_thread

CT = {"Content-Type": "application/octet-stream"}
MiB = 1024 * 1024


def _fill(http: httpx.Client, url: str, data: bytes, piece: int = 256 * 1024) -> None:
    assert http.put(url, headers=CT).status_code == 201
    for i in range(0, len(data), piece):
        assert http.post(url, headers=CT, content=data[i : i + piece]).is_success


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A server capped at 10 MiB per response, and a 13 MiB binary stream on it."""
    data_dir = tmp_path_factory.mktemp("large") / "data"
    with in_thread(data_dir, "--max-read-bytes", str(10 * MiB)) as srv:
        data = os.urandom(13 * MiB + 123)
        url = f"{srv.base}large/bin"
        _fill(srv.http, url, data)
        yield srv, url, data


def test_a_large_read_is_one_streamed_response_up_to_the_cap(big):
    srv, url, data = big
    http = srv.http
    r = http.get(url, params={"offset": "-1"}, timeout=30)
    assert r.status_code == 200
    assert int(r.headers["content-length"]) == 10 * MiB
    assert r.content == data[: 10 * MiB]
    assert "stream-up-to-date" not in r.headers
    rest = http.get(url, params={"offset": r.headers["stream-next-offset"]}, timeout=30)
    assert rest.status_code == 200 and rest.headers["stream-up-to-date"] == "true"
    assert r.content + rest.content == data
    # The streamed response's ETag works like any other read's.
    again = http.get(
        url, params={"offset": "-1"}, headers={"If-None-Match": r.headers["etag"]}, timeout=30
    )
    assert again.status_code == 304 and again.content == b""
    assert again.headers["stream-next-offset"] == r.headers["stream-next-offset"]


def test_a_large_read_from_the_middle_of_a_record(big):
    srv, url, data = big
    http = srv.http
    # Binary offsets count bytes: start inside a 256 KiB append and cross many of them.
    first = http.get(url, params={"offset": "-1"}, timeout=30)
    next_offset = first.headers["stream-next-offset"]
    epoch = next_offset.partition("_")[0]
    start = 1_000_001
    offset = f"{epoch}_{start:016d}"
    assert len(offset) == len(next_offset)
    r = http.get(url, params={"offset": offset}, timeout=30)
    assert r.content == data[start : start + 10 * MiB]
    assert r.headers["stream-next-offset"] == f"{epoch}_{start + 10 * MiB:016d}"


def test_a_large_read_of_a_fork_stitches_its_source(big):
    srv, _, data = big
    http = srv.http
    fork = f"{srv.base}large/fork"
    src_offset = f"0000000000000000_{12 * MiB:016d}"
    r = http.put(
        fork,
        headers=CT
        | {"Stream-Forked-From": "/v1/stream/large/bin", "Stream-Fork-Offset": src_offset},
    )
    if r.status_code != 201:
        pytest.fail(f"fork refused: {r.status_code} {r.text}")
    tail = os.urandom(2 * MiB)
    assert http.post(fork, headers=CT, content=tail).is_success
    got = b""
    offset = "-1"
    while True:
        r = http.get(fork, params={"offset": offset}, timeout=30)
        got += r.content
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date"):
            break
    assert got == data[: 12 * MiB] + tail
