"""Bad input against the real server (in-process, on the real engine): the right
status, a short reason, and no change.

Each case is sent to a stream with known content; afterwards the stream's
bytes, tail, closure and producer state must be exactly as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest

from testkit.asgi import RAW_TARGET, InProcessServer
from testkit.stream_reads import stream_state

CT = {"Content-Type": "application/octet-stream"}


@pytest.fixture(params=["one process", "through a worker"])
def srv(app_server, request) -> InProcessServer:
    """The same cases on a single process and through a worker (``--workers N``): a
    worker parses and checks, the writer refuses, and the refusal must come back whole."""
    return app_server(worker=request.param == "through a worker")


@pytest.fixture
def http(srv: InProcessServer) -> httpx.Client:
    assert srv.http is not None
    return srv.http


@pytest.fixture
def fresh(srv: InProcessServer, http: httpx.Client):
    """A stream holding b'seed' with one producer append; returns a snapshot function."""

    def make() -> tuple[str, Callable[[], tuple[object, ...]]]:
        url = f"{srv.base}bad/{uuid.uuid4().hex}"
        assert http.put(url, headers=CT, content=b"seed").status_code == 201
        r = http.post(
            url,
            headers=CT | {"Producer-Id": "w", "Producer-Epoch": "0", "Producer-Seq": "0"},
            content=b"!",
        )
        assert r.status_code == 200

        def snapshot() -> tuple[object, ...]:
            return stream_state(url, http)

        return url, snapshot

    return make


BAD_POSTS = [
    ("empty body", {}, b"", 400),
    ("content type mismatch", {"Content-Type": "text/plain"}, b"x", 409),
    ("missing content type", {"Content-Type": ""}, b"x", 400),
    ("partial producer headers", {"Producer-Id": "w"}, b"x", 400),
    (
        "empty producer id",
        {"Producer-Id": "", "Producer-Epoch": "0", "Producer-Seq": "1"},
        b"x",
        400,
    ),
    (
        "non-integer epoch",
        {"Producer-Id": "w", "Producer-Epoch": "x", "Producer-Seq": "1"},
        b"x",
        400,
    ),
    (
        "epoch too large",
        {"Producer-Id": "w", "Producer-Epoch": str(2**53), "Producer-Seq": "0"},
        b"x",
        400,
    ),
    ("sequence gap", {"Producer-Id": "w", "Producer-Epoch": "0", "Producer-Seq": "5"}, b"x", 409),
    (
        "new epoch not at 0",
        {"Producer-Id": "w", "Producer-Epoch": "1", "Producer-Seq": "3"},
        b"x",
        400,
    ),
]


@pytest.mark.parametrize(
    ("name", "headers", "body", "status"), BAD_POSTS, ids=[c[0] for c in BAD_POSTS]
)
def test_bad_appends_change_nothing(fresh, http, name, headers, body, status):
    url, snapshot = fresh()
    before = snapshot()
    r = http.post(url, headers=CT | headers, content=body)
    assert r.status_code == status, r.text
    assert r.text.strip(), "a refusal says why"
    assert snapshot() == before


def test_oversized_body_is_413_and_changes_nothing(app_server):
    srv = app_server("--max-body-bytes", "1000")
    http = srv.http
    url = f"{srv.base}big"
    http.put(url, headers=CT, content=b"x")
    r = http.post(url, headers=CT, content=b"y" * 1001)
    assert r.status_code == 413
    chunked = http.post(url, headers=CT, content=iter([b"y" * 600, b"y" * 600]))
    assert chunked.status_code == 413
    assert http.get(url).content == b"x"


def test_bad_json_is_400_and_changes_nothing(srv, http):
    url = f"{srv.base}bad/json-{uuid.uuid4().hex}"
    http.put(url, headers={"Content-Type": "application/json"}, content=b'[{"a":1}]')
    for body in [b"{", b"[]", b"nan", b'{"a":}']:
        r = http.post(url, headers={"Content-Type": "application/json"}, content=body)
        assert r.status_code == 400, body
    assert http.get(url).json() == [{"a": 1}]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Stream-TTL": "-5"}, 400),
        ({"Stream-TTL": "1.5"}, 400),
        ({"Stream-Expires-At": "yesterday"}, 400),
        ({"Stream-TTL": "10", "Stream-Expires-At": "2099-01-01T00:00:00Z"}, 400),
        ({"Stream-Forked-From": "/v1/stream/missing"}, 404),
        ({"Stream-Fork-Offset": "0000000000000000_0000000000000000"}, 400),
    ],
)
def test_bad_creates_create_nothing(srv, http, headers, status):
    url = f"{srv.base}bad/create-{uuid.uuid4().hex}"
    r = http.put(url, headers=CT | headers)
    assert r.status_code == status, r.text
    assert http.head(url).status_code == 404


@pytest.mark.parametrize(
    "raw",
    [
        "/v1/stream/a/../b",
        "/v1/stream/a%2Fb",
        "/v1/stream/a%00b",
        "/v1/stream/a//b",
        "/v1/stream/" + "x" * 2000,
    ],
)
def test_unsafe_paths_are_refused(srv, http, raw):
    # The target as sent: HTTP clients normalise "..", which would hide the case.
    r = http.put(f"{srv.url}/", headers=CT, extensions={RAW_TARGET: raw.encode()})
    assert r.status_code == 400, raw


@pytest.mark.parametrize(
    "offset",
    ["abc", "0000000000000000_00000000000000zz", "1_2", "9999999999999999_0000000000000000"],
)
def test_bad_offsets_are_400(fresh, http, offset):
    url, _ = fresh()
    assert http.get(url, params={"offset": offset}).status_code == 400


def test_offset_past_the_tail_is_400(fresh, http):
    url, _ = fresh()
    assert http.get(url, params={"offset": "0000000000000000_0000000000009999"}).status_code == 400


def test_reserved_subscription_paths_are_not_streams(srv, http):
    """``__ds`` is the subscription API (tests/subscriptions): never a stream path."""
    r = http.put(f"{srv.base}__ds/subscriptions/x", json={"type": "webhook"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "INVALID_REQUEST"
    r = http.put(f"{srv.base}__ds/x", headers={"content-type": "text/plain"})
    assert r.status_code == 404


def test_unicode_spellings_never_share_a_stream(srv, http):
    """NFC and NFD spellings are different paths: two streams, never one file."""
    nfc = "caf\u00e9"
    nfd = "cafe\u0301"
    tag = uuid.uuid4().hex
    for name, body in ((nfc, b"composed"), (nfd, b"decomposed")):
        url = f"{srv.base}u-{tag}/" + httpx.URL(name).raw_path.decode()
        assert http.put(url, headers=CT, content=body).status_code == 201
    for name, body in ((nfc, b"composed"), (nfd, b"decomposed")):
        url = f"{srv.base}u-{tag}/" + httpx.URL(name).raw_path.decode()
        assert http.get(url).content == body
