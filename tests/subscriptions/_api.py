"""Helpers for the subscription tests: a real webhook receiver, and a client for the API.

Test modules import ``receiver_fixture`` to get the ``receiver`` fixture (a
conftest.py here would shadow the root one that other tests import from).

The receiver is a real HTTP server on 127.0.0.1 (the protocol's development
exception for webhook URLs), in a thread; each test scripts its answers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

Answer = tuple[int, dict[str, Any] | None]


@dataclass
class Hook:
    raw: bytes
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Receiver:
    """Records every webhook; answers with ``answer(hook)`` (default 200 ``{}``)."""

    answer: Callable[[Hook], Answer] = lambda hook: (200, {})
    hooks: list[Hook] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                hook = Hook(raw, json.loads(raw), {k.lower(): v for k, v in self.headers.items()})
                with receiver.cond:
                    receiver.hooks.append(hook)
                    receiver.cond.notify_all()
                status, body = receiver.answer(hook)
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 30.0) -> Hook:
        """The ``count``-th webhook (1-based), waiting for it."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.hooks) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"webhook {count} never came ({len(self.hooks)} seen)"
                self.cond.wait(left)
            return self.hooks[count - 1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="receiver")
def receiver_fixture() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


class Api:
    """The subscription endpoints of one server."""

    def __init__(self, base: str, token: str | None = None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.base = base
        self.http = httpx.Client(timeout=30, headers=headers)

    def url(self, rest: str) -> str:
        return f"{self.base}__ds/{rest}"

    def put(self, sub_id: str, body: Any) -> httpx.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.http.put(self.url(f"subscriptions/{sub_id}"), content=data)

    def get(self, sub_id: str) -> httpx.Response:
        return self.http.get(self.url(f"subscriptions/{sub_id}"))

    def delete(self, sub_id: str) -> httpx.Response:
        return self.http.delete(self.url(f"subscriptions/{sub_id}"))

    def post(self, sub_id: str, action: str, body: Any, token: str | None = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.http.post(
            self.url(f"subscriptions/{sub_id}/{action}"), content=data, headers=headers
        )

    def stream(self, path: str, body: bytes | None = None, ct: str = "application/json") -> None:
        url = f"{self.base}{path}"
        r = self.http.put(url, content=body or b"", headers={"content-type": ct})
        assert r.status_code in (200, 201), r.text

    def append(self, path: str, body: bytes, ct: str = "application/json") -> str:
        r = self.http.post(f"{self.base}{path}", content=body, headers={"content-type": ct})
        assert r.status_code in (200, 204), r.text
        return r.headers["stream-next-offset"]

    def acked(self, sub_id: str) -> dict[str, str]:
        r = self.get(sub_id)
        assert r.status_code == 200, r.text
        return {s["path"]: s["acked_offset"] for s in r.json()["streams"]}

    def close(self) -> None:
        self.http.close()


def offset(unit: int) -> str:
    return f"0000000000000000_{unit:016d}"


def until(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``predicate`` until it returns something true (for state seen over HTTP)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.05)
