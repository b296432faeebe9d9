"""A real webhook receiver: an HTTP server on 127.0.0.1 (the protocol's development
exception for webhook URLs) in a thread, for the subscription tests and the benchmark.

It records every request with the moment its body was read, and answers with
``answer(hook)``, so that a test can script refusals and the benchmark can ack wakes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, dict[str, Any] | None]


@dataclass
class Hook:
    raw: bytes
    body: dict[str, Any]
    headers: dict[str, str]
    at: float = 0.0  # time.perf_counter() when the body was read: the benchmark's arrival


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
                at = time.perf_counter()
                headers = {k.lower(): v for k, v in self.headers.items()}
                hook = Hook(raw, json.loads(raw), headers, at)
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
        # serve_forever checks for shutdown() between waits of poll_interval (0.5 s by
        # default): every test's close() waited that long.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
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
