"""JSON mode against a real server: memory proportional to the body, a responsive event
loop while a large body is parsed, strict validation (400, never 5xx), exact values, and
the cap on messages per request (issue 11, findings 1 and 7)."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from conftest import stream_state
from testkit.servers import rss_bytes

pytestmark = pytest.mark.processes

JSON = {"Content-Type": "application/json"}
MiB = 1 << 20


@pytest.fixture
def json_stream(shared_server):
    url = f"{shared_server.base}json/{uuid.uuid4().hex}"
    assert httpx.put(url, headers=JSON, content=b'[{"seed":1}]').status_code == 201
    return url


@pytest.mark.parametrize(
    ("name", "body", "status"),
    [
        # 65,536 tiny messages: under the default cap of 100,000.
        ("128 KiB of [0,0,...]", b"[" + b",".join([b"0"] * 65536) + b"]", 204),
        # The finding's shapes: past the cap, refused whole.
        ("256 KiB of [0,0,...]", b"[" + b",".join([b"0"] * 131072) + b"]", 413),
        ("8 MiB of [0,0,...]", b"[" + b",".join([b"0"] * (4 * MiB)) + b"]", 413),
        # 8 MiB in 50,000 messages: taken.
        ("8 MiB of 160-byte objects", b"[" + b",".join([b'{"v":"' + b"x" * 150 + b'"}'] * 50000) + b"]", 204),
    ],
)  # fmt: skip
def test_memory_stays_proportional_to_the_body(shared_server, json_stream, name, body, status):
    pid = shared_server.proc.pid
    before = rss_bytes(pid, children=True)
    started = time.monotonic()
    r = httpx.post(json_stream, headers=JSON, content=body, timeout=60)
    elapsed = time.monotonic() - started
    grew = rss_bytes(pid, children=True) - before
    assert r.status_code == status, r.text
    # The old code held about 4 KiB per element (577 MiB for 256 KiB, 17 GiB for 8 MiB).
    assert grew < 24 * len(body) + 64 * MiB, f"{name}: RSS grew by {grew / MiB:.0f} MiB"
    assert elapsed < 30, f"{name}: {elapsed:.1f} s"


def test_the_event_loop_answers_while_a_large_body_is_parsed(shared_server, json_stream):
    # Elements nested deeper than the quick split: the slowest body to split.
    deep = b"[" + b",".join([b"[[[[[[1]]]]]]"] * 90000) + b"]"
    other = f"{shared_server.base}bin/{uuid.uuid4().hex}"
    assert httpx.put(other, headers={"Content-Type": "text/plain"}).status_code == 201
    result: dict[str, int] = {}

    def hostile() -> None:
        result["status"] = httpx.post(
            json_stream, headers=JSON, content=deep, timeout=60
        ).status_code

    t = threading.Thread(target=hostile)
    t.start()
    worst = 0.0
    with httpx.Client(timeout=30) as c:
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
def test_invalid_json_is_400_and_changes_nothing(shared_server, json_stream, body):
    before = stream_state(json_stream)
    r = httpx.post(json_stream, headers=JSON, content=body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert "invalid JSON" in r.text
    assert stream_state(json_stream) == before
    # On create too.
    r = httpx.put(f"{shared_server.base}json/{uuid.uuid4().hex}", headers=JSON, content=body)
    assert r.status_code == 400


def test_values_come_back_exactly_as_sent(json_stream):
    sent = [b"1180591620717411303424", b"1.10", b"1e2", b'"\\u00e9 \xc3\xa9"', b'{"a": [1, 2.50]}']
    body = b"[ " + b" , ".join(sent) + b" ]"
    assert httpx.post(json_stream, headers=JSON, content=body).status_code == 204
    got = httpx.get(json_stream, params={"offset": "-1"}).content
    assert got == b'[{"seed":1},' + b",".join(sent) + b"]"


def test_the_cap_on_messages_per_request(server_factory):
    srv = server_factory("--max-json-messages", "10").start()
    url = f"{srv.base}capped"
    assert httpx.put(url, headers=JSON).status_code == 201
    assert httpx.post(url, headers=JSON, content=b"[" + b"1," * 9 + b"1]").status_code == 204
    before = stream_state(url)
    r = httpx.post(url, headers=JSON, content=b"[" + b"1," * 10 + b"1]")
    assert r.status_code == 413 and "10" in r.text
    assert stream_state(url) == before
