"""Helpers for the subscription tests: a real webhook receiver, and a client for the API.

Test modules import ``receiver_fixture`` to get the ``receiver`` fixture (a
conftest.py here would shadow the root one that other tests import from).

The receiver (testkit.webhooks, shared with the benchmark) is a real HTTP server on
127.0.0.1 in a thread; each test scripts its answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from testkit.webhooks import Answer, Hook, Receiver

__all__ = ["Answer", "Api", "Hook", "Receiver", "offset", "pull", "receiver_fixture", "until"]


@pytest.fixture(name="receiver")
def receiver_fixture() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


class Api:
    """The subscription endpoints of one server."""

    def __init__(
        self, base: str, token: str | None = None, transport: httpx.BaseTransport | None = None
    ) -> None:
        """``transport``: an in-process server's (``testkit.asgi``); None for a process's."""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.base = base
        self.transport = transport  # for clients of a test's own (threads)
        self.http = httpx.Client(timeout=30, headers=headers, transport=transport)

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


def pull(lease: int = 60_000, **extra: Any) -> dict[str, Any]:
    """A pull-wake subscription's body: events/* woken on wake/pool."""
    return {
        "type": "pull-wake",
        "pattern": "events/*",
        "wake_stream": "wake/pool",
        "lease_ttl_ms": lease,
        **extra,
    }


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
