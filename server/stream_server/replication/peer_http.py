"""A lean keep-alive HTTP/1.1 client for a standby's fetches: httptools over
asyncio streams.

A standby asks its primary for frames one request after another, on one
connection, with nothing but a query and a bearer token; every write of the
set waits for that round trip, and each standby makes one per write. httpx
spent 1 to 3 ms of CPU per request on it (its request and response models,
URL parsing, the connection pool, anyio's cancel scopes), and without it
h11 still parsed every answer's status line and headers in pure Python,
once per write (docs/performance.md, "The write path's round trip, second
round"). httptools, the C parser
uvicorn serves with (installed with it), parses the answer: the status
line, the headers, Content-Length and chunked bodies, and whether the
connection may be kept. This module
writes the request line and headers itself (a GET with a few headers of our
own, refused if any holds a line break) and only moves bytes.

An https peer is reached with the context the caller's ``tls`` gives at each
new connection (``peer_tls.py``: the set's CA bundle and client certificate),
by default one checking against the system's CAs.

``open_stream`` asks a peer to switch a new connection to another protocol
(``Upgrade``, answered ``101 Switching Protocols``) and returns the
connection's two streams with the bytes that came after the ``101``; any
other answer is returned whole, and its connection closed.

A dropped connection: a request that fails on a connection used before,
before any byte of its answer arrived, is sent once more on a new
connection (the primary may have closed an idle keep-alive connection just
as we sent; a GET here is idempotent: a fetch names a position, and the
same position twice is the same acknowledgement). Any other failure
closes the connection and raises ``PeerError``; the next request connects
anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httptools

READ_SIZE = 256 * 1024  # bytes asked of the socket at a time (a fetch answer is up to 4 MiB)


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
        self.keep = False  # the connection may carry the next request
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        # Asked here: llhttp answers for the message being parsed, not after it.
        self.keep = self.parser.should_keep_alive()
        self.complete = True


class _Connection:
    """One HTTP/1.1 connection, used for one request at a time."""

    def __init__(
        self, origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.origin = origin
        host = f"[{origin[1]}]" if ":" in origin[1] else origin[1]  # an IPv6 address
        default = 443 if origin[0] == "https" else 80
        self.host = host if origin[2] == default else f"{host}:{origin[2]}"
        self.reader = reader
        self.writer = writer
        self.used = False  # a request completed on it: the peer may have closed it since
        self.keep = True  # the last answer let us keep the connection

    @classmethod
    async def open(cls, origin: Origin, tls: TlsContext) -> _Connection:
        scheme, host, port = origin
        context = tls() if scheme == "https" else None
        reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=READ_SIZE)
        return cls(origin, reader, writer)

    @property
    def reusable(self) -> bool:
        return self.keep and not self.reader.at_eof()

    async def request(
        self, target: str, headers: list[tuple[str, str]], on_sent: Callable[[], None]
    ) -> PeerResponse:
        """Send a GET (``on_sent`` once it is written) and read its whole answer.
        ``_Unanswered`` when not one byte of the answer arrived (the request may be
        retried on a new connection)."""
        request = _get(target, headers)
        self.keep = False  # until an answer says otherwise
        answer = _Answer()
        answered = False
        try:
            self.writer.write(request)
            await self.writer.drain()
            on_sent()
            while not answer.complete:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    raise ConnectionResetError("the peer closed the connection")
                answered = True
                answer.parser.feed_data(data)
        except (OSError, httptools.HttpParserError) as exc:
            if not answered:
                raise _Unanswered(exc) from exc
            raise PeerError(f"{type(exc).__name__}: {exc}") from exc
        self.used = True
        self.keep = answer.keep
        status = answer.parser.get_status_code()
        return PeerResponse(status, answer.headers, b"".join(answer.parts))

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


class _Unanswered(Exception):
    """The request failed before a byte of its answer came back."""


class PeerClient:
    """GETs to peers, on one kept-alive connection to the origin last asked."""

    def __init__(self, timeout: float, tls: TlsContext = system_tls) -> None:
        self.timeout = timeout
        self.tls = tls
        self._conn: _Connection | None = None
        self.connects = 0  # connections opened (tests, and a look at reuse)

    async def get(
        self,
        url: str,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        on_sent: Callable[[], None] = lambda: None,
    ) -> PeerResponse:
        """GET ``url``; ``on_sent`` is called once the request is written (the follower
        lets its writer thread go on from there, ``applier.py``)."""
        origin, target = _target(url, params)
        try:
            async with asyncio.timeout(self.timeout):
                return await self._send(origin, target, headers or {}, on_sent)
        except TimeoutError:
            self._drop()
            raise PeerError(f"no answer from {url} within {self.timeout:g}s") from None
        except BaseException:
            self._drop()  # cancelled or failed mid-request: the connection's state is unknown
            raise

    async def _send(
        self, origin: Origin, target: str, headers: dict[str, str], on_sent: Callable[[], None]
    ) -> PeerResponse:
        conn = self._conn
        if conn is not None and (conn.origin != origin or not conn.reusable):
            self._drop()
            conn = None
        for attempt in (0, 1):
            if conn is None:
                try:
                    conn = await _Connection.open(origin, self.tls)
                except OSError as exc:
                    raise PeerError(f"cannot connect to {origin[1]}:{origin[2]}: {exc}") from exc
                self.connects += 1
                self._conn = conn
            head = [("host", conn.host), *headers.items()]
            try:
                return await conn.request(target, head, on_sent)
            except _Unanswered as exc:
                fresh = not conn.used
                self._drop()
                conn = None
                if fresh or attempt:
                    cause = exc.__cause__
                    raise PeerError(f"{type(cause).__name__}: {cause}") from cause
            except PeerError:
                self._drop()
                raise
        raise AssertionError("unreachable")

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    async def aclose(self) -> None:
        self._drop()
