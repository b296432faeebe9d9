"""A TCP proxy in front of the emulated API server that loses answers and cuts a server off.

Each server of a set gets its own proxy (``DS_KUBE_API`` pointing at it), so a
test can act on one server's Lease traffic only. The proxy reads each HTTP/1.1
request whole (head and ``Content-Length`` body), forwards it on an upstream
connection of its own, reads the answer whole, and then, as the test says:

- passes the answer on (``pass``, the default);
- **loses it** (``lose_answer``): a request matching a rule (method, a part of
  the path, a predicate on the JSON body) is forwarded and its answer read; if
  that answer is a success (2xx), so that the write *happened*, the client
  connection is closed without a byte of the answer: the client sees the
  connection cut, as when a network drops the reply of a write kube-apiserver
  committed. The rule then switches the proxy
  to the mode it names (``then``), e.g. ``blackhole`` for "and from here on
  the API cannot be reached". A matching request refused upstream (a 409 for a
  compare-and-swap that lost) gets its answer and the rule stays armed: a fault
  test whose premise is "the write landed" must not fire on one that did not;
- **refuses** (``cut("refuse")``): every request's connection is closed at once,
  unforwarded (the API unreachable and saying so quickly);
- **blackholes** (``cut("blackhole")``): requests are read and never forwarded
  nor answered, so each client call waits for its own timeout (a partition).

The proxy runs an asyncio loop in a thread of the test process and listens on
loopback; its upstream is the API's URL. Every rule that fired is recorded with
the time it fired (``time.monotonic``) in ``fired``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

Mode = Literal["pass", "refuse", "blackhole"]


@dataclass
class Rule:
    """Lose the answer of the next ``times`` requests like this, then switch to ``then``."""

    method: str
    path: str  # a part of the request's path
    body: Callable[[Any], bool] = lambda _: True  # on the request's JSON body (None if not JSON)
    then: Mode = "pass"
    times: int = 1
    fired: threading.Event = field(default_factory=threading.Event)
    at: list[float] = field(default_factory=list)  # when each loss happened

    def matches(self, method: str, path: str, body: bytes) -> bool:
        if self.times <= 0 or method != self.method or self.path not in path:
            return False
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        return bool(self.body(parsed))


class ApiProxy:
    """One server's way to the API server; see the module doc."""

    def __init__(self, upstream: str, name: str = "", host: str = "127.0.0.1") -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.name = name
        self.host = host
        self.port = 0
        self.mode: Mode = "pass"
        self.rules: list[Rule] = []
        self.fired: list[tuple[float, str]] = []  # (when, what) for every loss and cut
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._held: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- control, from the test's thread ----------------------------------------------------

    def start(self) -> ApiProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, self.host, 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._held):
                w.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> ApiProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lose_answer(
        self,
        method: str,
        path: str,
        body: Callable[[Any], bool] = lambda _: True,
        *,
        then: Mode = "pass",
        times: int = 1,
    ) -> Rule:
        """Arm a rule (module doc); wait on its ``fired`` event to know it happened."""
        rule = Rule(method, path, body, then, times)
        self.rules.append(rule)
        return rule

    def cut(self, mode: Mode = "blackhole") -> None:
        """From now on refuse or blackhole every request (``heal`` undoes it)."""
        self.mode = mode
        self.fired.append((time.monotonic(), mode))

    def heal(self) -> None:
        self.mode = "pass"
        self.fired.append((time.monotonic(), "heal"))

        def release() -> None:
            for w in list(self._held):  # blackholed calls: their connections go
                w.close()

        self._loop.call_soon_threadsafe(release)

    # -- the proxy, on its loop -------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._held.add(writer)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                head, body, method, path = request
                self.requests += 1
                if self.mode == "refuse":
                    return
                if self.mode == "blackhole":
                    await _forever(reader)
                    return
                if up is None:
                    up = await asyncio.open_connection(*self.upstream)
                up[1].write(head + body)
                await up[1].drain()
                answer = await _read_answer(up[0])
                # Only a write that happened: a 409 (a compare-and-swap that lost to a
                # renewal) passes on, and the rule waits for the retry that lands.
                rule = (
                    next((r for r in self.rules if r.matches(method, path, body)), None)
                    if _succeeded(answer)
                    else None
                )
                if rule is not None:
                    rule.times -= 1
                    now = time.monotonic()
                    rule.at.append(now)
                    self.fired.append((now, f"lost the answer to {method} {path}"))
                    self.mode = rule.then
                    rule.fired.set()
                    return  # the write happened; its answer is never sent
                if self.mode != "pass":  # cut while the request was on its way
                    return
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            self._held.discard(writer)
            writer.close()
            if up is not None:
                up[1].close()


def _succeeded(answer: bytes) -> bool:
    """Whether an HTTP answer's status line says 2xx."""
    parts = answer.split(b" ", 2)
    return len(parts) > 1 and parts[1][:1] == b"2"


async def _forever(reader: asyncio.StreamReader) -> None:
    """Hold a blackholed connection until the client gives up (or the proxy closes it)."""
    with contextlib.suppress(ConnectionError, OSError):
        while await reader.read(65536):
            pass


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


async def _read_request(
    reader: asyncio.StreamReader,
) -> tuple[bytes, bytes, str, str] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed its connection between requests
    method, path = head.split(b" ", 2)[:2]
    length = int(_headers(head).get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return head, body, method.decode(), path.decode()


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    headers = _headers(head)
    if "content-length" in headers:
        return head + await reader.readexactly(int(headers["content-length"]))
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = [head]
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            parts += [size_line, chunk]
            if size == 0:
                return b"".join(parts)
    return head + await reader.read()  # until the server closes
