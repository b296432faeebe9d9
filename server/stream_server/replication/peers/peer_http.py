"""A standby's request for its stream (``standby/receiver.py``): httptools over asyncio streams.

``open_stream`` asks a peer to switch a new connection to another protocol
(``Upgrade``, answered ``101 Switching Protocols``) and returns the
connection's two streams with the bytes that came after the ``101``; any
other answer is returned whole, and its connection closed. The standby's
side of the stream then only moves bytes, so it wants no HTTP client
library's request and response models, URL parsing, connection pool or
cancel scopes (httpx spent 1 to 3 ms of CPU per request here, when a standby
made one per write: docs/performance.md, "The write path's round trip,
second round"). httptools, the C parser uvicorn serves with (installed with
it), parses the answer: the status line, the headers, Content-Length and
chunked bodies. This module writes the request line and headers itself (a
GET with a few headers of our own, refused if any holds a line break).

An https peer is reached with the context the caller's ``tls`` gives at each
new connection (``peer_tls.py``: the set's CA bundle and client certificate),
by default one checking against the system's CAs.

Any failure (no connection, a dropped one, bad HTTP, no answer in time)
raises ``PeerError``, and the caller asks again.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httptools

READ_SIZE = 256 * 1024  # bytes asked of the socket at a time (a stream sends up to 4 MiB)


class PeerError(Exception):
    """The request failed: no connection, a dropped one, a timeout, or bad HTTP."""


@dataclass(frozen=True, slots=True)
class PeerResponse:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Origin = tuple[str, str, int]  # scheme, host, port
# The client context for a new https connection (``peer_tls.PeerTls.context``).
TlsContext = Callable[[], ssl.SSLContext]


@functools.cache
def system_tls() -> ssl.SSLContext:
    """Certificates checked against the system's CAs: without ``--replication-ca-file``."""
    return ssl.create_default_context()


class _Answer:
    """httptools' callbacks for one response: what it parsed so far."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.parts: list[bytes] = []
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    """One HTTP/1.1 connection, for one request asking for an upgrade."""

    def __init__(
        self, origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host = f"[{origin[1]}]" if ":" in origin[1] else origin[1]  # an IPv6 address
        default = 443 if origin[0] == "https" else 80
        self.host = host if origin[2] == default else f"{host}:{origin[2]}"
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, origin: Origin, tls: TlsContext) -> _Connection:
        scheme, host, port = origin
        context = tls() if scheme == "https" else None
        reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=READ_SIZE)
        return cls(origin, reader, writer)

    def close(self) -> None:
        self.writer.close()

    async def upgrade(
        self, target: str, headers: list[tuple[str, str]]
    ) -> PeerStream | PeerResponse:
        """Send a GET asking for an upgrade; the stream on ``101``, else the answer."""
        request = _get(target, headers)
        answer = _Answer()
        try:
            self.writer.write(request)
            await self.writer.drain()
            while not answer.complete:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    raise ConnectionResetError("the peer closed the connection")
                try:
                    answer.parser.feed_data(data)
                except httptools.HttpParserUpgrade as up:
                    if answer.parser.get_status_code() != 101:
                        raise PeerError("an upgrade answered without 101") from None
                    return PeerStream(self.reader, self.writer, answer.headers, data[up.args[0] :])
        except (OSError, httptools.HttpParserError) as exc:
            raise PeerError(f"{type(exc).__name__}: {exc}") from exc
        status = answer.parser.get_status_code()
        return PeerResponse(status, answer.headers, b"".join(answer.parts))


@dataclass(frozen=True, slots=True)
class PeerStream:
    """A connection switched to another protocol: its streams, the ``101``'s headers
    (names in lower case) and what the peer sent after them."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    headers: dict[str, str]
    early: bytes


async def open_stream(
    url: str,
    params: dict[str, Any],
    headers: dict[str, str],
    upgrade: str,
    *,
    within: float,
    tls: TlsContext = system_tls,
) -> PeerStream | PeerResponse:
    """Ask ``url`` to switch a new connection to ``upgrade``: the stream on
    ``101``; any other answer, whole, with the connection closed. PeerError when
    the answer's head has not come ``within`` seconds (a bound of its own, not the
    caller's ``asyncio.timeout``: it ends the connecting, not the stream, and is
    reported as the peer's silence)."""
    origin, target = _target(url, params)
    try:
        async with asyncio.timeout(within):
            try:
                conn = await _Connection.open(origin, tls)
            except OSError as exc:
                raise PeerError(f"cannot connect to {origin[1]}:{origin[2]}: {exc}") from exc
            head = [("host", conn.host), ("connection", "upgrade"), ("upgrade", upgrade)]
            try:
                answer = await conn.upgrade(target, [*head, *headers.items()])
            except BaseException:
                conn.close()
                raise
    except TimeoutError:
        raise PeerError(f"no answer from {url} within {within:g}s") from None
    if isinstance(answer, PeerResponse):
        conn.close()
    return answer


def _get(target: str, headers: list[tuple[str, str]]) -> bytes:
    """A GET's head, refused unsent if the target or a header holds a line break."""
    lines = [f"GET {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    if any("\r" in line or "\n" in line for line in lines):
        raise PeerError("a line break in the request's target or headers")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _target(url: str, params: dict[str, Any] | None) -> tuple[Origin, str]:
    """The origin to connect to and the request target, for ``url`` with ``params``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PeerError(f"not an http(s) URL: {url!r}")
    origin = (
        parts.scheme,
        parts.hostname,
        parts.port or (443 if parts.scheme == "https" else 80),
    )
    target = parts.path or "/"
    query = "&".join(q for q in (parts.query, urlencode(params or {})) if q)
    if query:
        target += "?" + query
    return origin, target
