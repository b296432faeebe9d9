"""``/replication/stream`` is answered ahead of Starlette (``replication/stream_endpoint.py``),
and keeps what Starlette's route did: the peer token first, 400 for bad parameters,
503 during recovery, 405 for other methods; the fetch it replaced is gone. The real app object, called as uvicorn
calls it; its Starlette part is replaced by one that fails the test if reached."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from stream_server.app import StreamServerApp
from stream_server.config import Settings


class Reached(AssertionError):
    pass


async def starlette_must_not_run(scope, receive, send) -> None:
    raise Reached(f"{scope['method']} {scope['path']} went through Starlette")


@pytest.fixture
def app(tmp_path: Path) -> tuple[StreamServerApp, str]:
    token = secrets.token_urlsafe(16)
    (tmp_path / "token").write_text(token)
    settings = Settings(
        data_dir=tmp_path / "data",
        replication_lease="default/stream-endpoint",
        replica_name="r0",
        replica_url="http://127.0.0.1:1",
        kube_api="http://127.0.0.1:1",
        replication_token_file=str(tmp_path / "token"),
    )
    a = StreamServerApp(settings)
    a.web = starlette_must_not_run  # type: ignore[assignment]
    return a, token


async def call(
    a: StreamServerApp,
    method: str,
    query: str,
    headers: list[tuple[bytes, bytes]],
    path: str = "/replication/stream",
) -> tuple[int, dict[bytes, bytes], bytes]:
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query.encode(),
        "headers": headers,
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await a(scope, receive, send)
    start, body = sent
    return start["status"], dict(start["headers"]), body["body"]


QUERY = "name=r1&term=1&after_term=0&after_lsn=0&committed=0"


async def test_a_stream_request_without_the_token_is_refused_ahead_of_starlette(app):
    a, token = app
    for headers in (
        [],
        [(b"authorization", b"Bearer wrong")],
        [(b"authorization", token.encode())],
    ):
        status, hs, body = await call(a, "GET", QUERY, headers)
        assert status == 401, headers
        assert json.loads(body)["error"]["code"] == "UNAUTHORIZED"
        assert hs[b"www-authenticate"] == b'Bearer realm="replication"'
        assert hs[b"content-length"] == str(len(body)).encode()


async def test_with_the_token_bad_parameters_and_recovery_are_answered_there_too(app):
    a, token = app
    auth = [(b"authorization", f"Bearer {token}".encode())]
    status, _, body = await call(a, "GET", "name=r1&term=x", auth)
    assert status == 400 and b"integers" in body
    status, _, _ = await call(a, "GET", "term=1", auth)
    assert status == 400
    # Not recovered (the lifespan never ran here): a valid request gets 503, not frames.
    status, _, body = await call(a, "GET", QUERY, auth)
    assert (status, body) == (503, b"recovery not finished\n")
    status, hs, _ = await call(a, "POST", QUERY, auth)
    assert (status, hs[b"allow"]) == (405, b"GET")


async def test_other_replication_paths_still_go_through_starlette(app):
    a, token = app
    auth = [(b"authorization", f"Bearer {token}".encode())]
    # The removed fetch's path included: Starlette's, so a 404.
    paths = ("/replication", "/replication/snapshot", "/replication/fetch", "/replication/stream/")
    for path in paths:
        with pytest.raises(Reached):
            await call(a, "GET", "", auth, path=path)
