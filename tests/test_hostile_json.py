"""JSON mode against the real server (in-process, on the real engine): a responsive event
loop while a large body is parsed, strict validation (400, never 5xx), exact values, and
the cap on messages per request (issue 11, findings 1 and 7). Memory proportional to the
body is measured on a server process, in test_hostile_requests.py."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from testkit.asgi import InProcessServer
from testkit.stream_reads import stream_state

JSON = {"Content-Type": "application/json"}


@pytest.fixture(params=["one process", "through a worker"])
def srv(app_server, request) -> InProcessServer:
    """Each case on a single process and through a worker (``--workers N``)."""
    return app_server(worker=request.param == "through a worker")


@pytest.fixture
def http(srv: InProcessServer) -> httpx.Client:
    assert srv.http is not None
    return srv.http


@pytest.fixture
def json_stream(srv, http):
    url = f"{srv.base}json/{uuid.uuid4().hex}"
    assert http.put(url, headers=JSON, content=b'[{"seed":1}]').status_code == 201
    return url


def test_the_event_loop_answers_while_a_large_body_is_parsed(srv, http, json_stream):
    # Elements nested deeper than the quick split: the slowest body to split.
    deep = b"[" + b",".join([b"[[[[[[1]]]]]]"] * 90000) + b"]"
    other = f"{srv.base}bin/{uuid.uuid4().hex}"
    assert http.put(other, headers={"Content-Type": "text/plain"}).status_code == 201
    result: dict[str, int] = {}

    def hostile() -> None:
        result["status"] = http.post(
            json_stream, headers=JSON, content=deep, timeout=60
        ).status_code

    t = threading.Thread(target=hostile)
    t.start()
    worst = 0.0
    with httpx.Client(timeout=30, transport=srv.transport) as c:
        while t.is_alive():
            started = time.monotonic()
            assert (
                c.post(other, headers={"Content-Type": "text/plain"}, content=b"x").status_code
                == 204
            )
            worst = max(worst, time.monotonic() - started)
    t.join()
    assert result["status"] == 204
    assert worst < 1.0, f"a small append waited {worst:.2f} s behind the JSON parse"


HOSTILE = {
    "NaN": b"NaN",
    "Infinity": b"[Infinity]",
    "-Infinity": b"[1,-Infinity]",
    "1e400": b"[1e400]",
    "lone surrogate": b'"\\ud800"',
    "nesting 2000 deep": b"[" * 2000 + b"]" * 2000,
    "invalid UTF-8": b'["\xff"]',
    "trailing comma": b"[1,]",
    "trailing garbage": b"[1] x",
    "truncated": b'[{"a":',
}


@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
def test_invalid_json_is_400_and_changes_nothing(srv, http, json_stream, body):
    before = stream_state(json_stream, http)
    r = http.post(json_stream, headers=JSON, content=body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert "invalid JSON" in r.text
    assert stream_state(json_stream, http) == before
    # On create too.
    r = http.put(f"{srv.base}json/{uuid.uuid4().hex}", headers=JSON, content=body)
    assert r.status_code == 400


def test_values_come_back_exactly_as_sent(http, json_stream):
    sent = [b"1180591620717411303424", b"1.10", b"1e2", b'"\\u00e9 \xc3\xa9"', b'{"a": [1, 2.50]}']
    body = b"[ " + b" , ".join(sent) + b" ]"
    assert http.post(json_stream, headers=JSON, content=body).status_code == 204
    got = http.get(json_stream, params={"offset": "-1"}).content
    assert got == b'[{"seed":1},' + b",".join(sent) + b"]"


def test_the_cap_on_messages_per_request(app_server):
    srv = app_server("--max-json-messages", "10")
    http = srv.http
    url = f"{srv.base}capped"
    assert http.put(url, headers=JSON).status_code == 201
    assert http.post(url, headers=JSON, content=b"[" + b"1," * 9 + b"1]").status_code == 204
    before = stream_state(url, http)
    r = http.post(url, headers=JSON, content=b"[" + b"1," * 10 + b"1]")
    assert r.status_code == 413 and "10" in r.text
    assert stream_state(url, http) == before
