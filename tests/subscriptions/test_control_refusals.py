"""Refusals of the ``__ds`` control API found by trying the docs (issue 26), in-process.

The app runs on the real engine in a temporary directory and is driven through
httpx's ASGI transport: no socket, no process. Each test names the defect it
pins down: ids that no callback URL can reach, links to paths no stream can
have, a 503 without ``Retry-After``, a standby's refusal in plain text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest

from stream_server.app import StreamServerApp, create_app
from stream_server.config import Settings
from testkit import wait_for

BASE = "http://ds.test/v1/stream/"
PULL = {"type": "pull-wake", "streams": ["events/a"], "wake_stream": "wakes"}


@pytest.fixture
async def app(tmp_path) -> AsyncIterator[StreamServerApp]:
    a = create_app(Settings(data_dir=tmp_path / "data", max_subscriptions=2, metrics=False))
    async with a.lifespan(a.web):
        # Recovery and the subscriptions start in the background: wait off the loop.
        await asyncio.to_thread(
            wait_for, lambda: a.subscriptions.started, message="subscriptions started"
        )
        yield a


@pytest.fixture
async def client(app: StreamServerApp) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c


def error_code(r: httpx.Response) -> str:
    assert r.headers["content-type"] == "application/json", r.text
    return str(r.json()["error"]["code"])


@pytest.mark.parametrize("sub_id", ["%2E", "%2E%2E", "%2e"])
async def test_ids_dot_and_dot_dot_are_refused_since_no_callback_url_reaches_them(
    client: httpx.AsyncClient, sub_id: str
) -> None:
    # (httpx resolves a literal "." segment away, as every client does: hence %2E.)
    r = await client.put(f"__ds/subscriptions/{sub_id}", json=PULL)
    assert r.status_code == 400
    assert error_code(r) == "INVALID_REQUEST"
    assert "'.' or '..'" in r.json()["error"]["message"]
    assert (await client.get(f"__ds/subscriptions/{sub_id}")).status_code == 404  # nothing made
    assert (await client.put("__ds/subscriptions/a.b..c", json=PULL)).status_code == 201


@pytest.mark.parametrize(
    "path",
    [
        "events/" + "x" * 256,  # one segment past 255 bytes
        "/".join(["y" * 200] * 3),  # 602 bytes: under --max-path-bytes, past 511
        "/".join(["é" * 100] * 3),  # 602 bytes of UTF-8 in 302 characters
    ],
)
async def test_links_are_checked_by_the_rule_stream_paths_are(
    client: httpx.AsyncClient, path: str
) -> None:
    # A stream request refuses the path, so a link to it could never be woken.
    assert (await client.put(path, headers={"content-type": "text/plain"})).status_code == 400
    for body in (
        {**PULL, "streams": [path]},
        {**PULL, "wake_stream": path},
    ):
        r = await client.put("__ds/subscriptions/s", json=body)
        assert r.status_code == 400, r.text
        assert error_code(r) == "INVALID_REQUEST"
    assert (await client.get("__ds/subscriptions/s")).status_code == 404
    created = await client.put("__ds/subscriptions/s", json=PULL)
    assert created.status_code == 201
    added = await client.post("__ds/subscriptions/s/streams", json={"streams": [path]})
    assert added.status_code == 400
    assert error_code(added) == "INVALID_REQUEST"


async def test_the_longest_stream_path_is_a_valid_link(client: httpx.AsyncClient) -> None:
    path = "/".join(["z" * 255, "z" * 255])  # 511 bytes: the longest a stream may have
    assert (await client.put(path, headers={"content-type": "text/plain"})).status_code == 201
    r = await client.put("__ds/subscriptions/s", json={**PULL, "streams": [path]})
    assert r.status_code == 201, r.text
    assert [s["path"] for s in r.json()["streams"]] == [path]


async def test_the_subscription_limit_answers_503_with_retry_after(
    client: httpx.AsyncClient,
) -> None:
    for sub_id in ("one", "two"):  # max_subscriptions=2
        assert (await client.put(f"__ds/subscriptions/{sub_id}", json=PULL)).status_code == 201
    r = await client.put("__ds/subscriptions/three", json=PULL)
    assert r.status_code == 503
    assert error_code(r) == "UNAVAILABLE"
    assert r.headers["retry-after"] == "1"
    assert (await client.put("__ds/subscriptions/one", json=PULL)).status_code == 200


async def test_a_refusal_before_the_routes_is_json_on_the_control_paths_and_text_on_streams(
    app: StreamServerApp,
) -> None:
    """What app.py sends when a standby refuses a write (``Replication._not_primary``'s
    status, headers and text): the control API's JSON on ``__ds`` paths, as
    docs/subscriptions.md promises, and text on streams as before."""
    headers = [(b"retry-after", b"1"), (b"stream-primary", b"http://r0:4437")]
    reason = b"this replica is a standby; write to the primary at http://r0:4437\n"

    async def refused(path: str) -> tuple[int, dict[str, str], bytes]:
        sent: list[MutableMapping[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "PUT", "path": path, "raw_path": path.encode()}
        await app.streams.refuse(scope, send, 503, headers, reason)
        start, body = sent
        names = {k.decode(): v.decode() for k, v in start["headers"]}
        return start["status"], names, body["body"]

    status, names, body = await refused("/v1/stream/__ds/subscriptions/w")
    assert status == 503
    assert names["content-type"] == "application/json"
    assert names["retry-after"] == "1"
    assert names["stream-primary"] == "http://r0:4437"
    assert json.loads(body) == {
        "error": {"code": "UNAVAILABLE", "message": reason.decode().strip()}
    }
    status, names, body = await refused("/v1/stream/events/a")
    assert (status, names["content-type"], body) == (503, "text/plain; charset=utf-8", reason)
