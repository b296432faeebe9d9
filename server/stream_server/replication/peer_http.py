"""A lean keep-alive HTTP/1.1 client for a standby's fetches: h11 over asyncio streams.

A standby asks its primary for frames one request after another, on one
connection, with nothing but a query and a bearer token; every write of the
set waits for that round trip. httpx spent 1 to 3 ms of CPU per request on
it (its request and response models, URL parsing, the connection pool,
anyio's cancel scopes), more than the standby's apply of the frames
(docs/performance.md, "Replication"). This client keeps only what a
follower uses: one connection per origin, GET, a timeout per request. h11
(already installed with uvicorn) does all the HTTP: request framing, the
response head, Content-Length and chunked bodies, and whether the
connection may be reused; this module only moves bytes.

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
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import h11

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
        self.h11 = h11.Connection(h11.CLIENT)
        self.used = False  # a request completed on it: the peer may have closed it since

    @classmethod
    async def open(cls, origin: Origin) -> _Connection:
        scheme, host, port = origin
        context = ssl.create_default_context() if scheme == "https" else None
        reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=READ_SIZE)
        return cls(origin, reader, writer)

    @property
    def reusable(self) -> bool:
        return self.h11.our_state is h11.IDLE and not self.reader.at_eof()

    async def request(self, target: str, headers: list[tuple[str, str]]) -> PeerResponse:
        """Send a GET and read its whole answer. ``_Unanswered`` when not one byte of the
        answer arrived (the request may be retried on a new connection)."""
        head = self.h11.send(h11.Request(method="GET", target=target, headers=headers))
        end = self.h11.send(h11.EndOfMessage())
        answered = False
        try:
            self.writer.write((head or b"") + (end or b""))
            await self.writer.drain()
            status = 0
            names: dict[str, str] = {}
            parts: list[bytes | bytearray] = []
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    data = await self.reader.read(READ_SIZE)
                    answered = answered or bool(data)
                    self.h11.receive_data(data)  # b"": the peer closed; h11 tells below
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    names = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    parts.append(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise ConnectionResetError("the peer closed the connection")
                # InformationalResponse (1xx): keep reading
        except (OSError, h11.ProtocolError) as exc:
            if not answered:
                raise _Unanswered(exc) from exc
            raise PeerError(f"{type(exc).__name__}: {exc}") from exc
        self.used = True
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()  # keep-alive; otherwise ``reusable`` is False
        return PeerResponse(status, names, b"".join(parts))

    def close(self) -> None:
        self.writer.close()


class _Unanswered(Exception):
    """The request failed before a byte of its answer came back."""


class PeerClient:
    """GETs to peers, on one kept-alive connection to the origin last asked."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._conn: _Connection | None = None
        self.connects = 0  # connections opened (tests, and a look at reuse)

    async def get(
        self, url: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> PeerResponse:
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
        try:
            async with asyncio.timeout(self.timeout):
                return await self._send(origin, target, headers or {})
        except TimeoutError:
            self._drop()
            raise PeerError(f"no answer from {url} within {self.timeout:g}s") from None
        except BaseException:
            self._drop()  # cancelled or failed mid-request: the connection's state is unknown
            raise

    async def _send(self, origin: Origin, target: str, headers: dict[str, str]) -> PeerResponse:
        conn = self._conn
        if conn is not None and (conn.origin != origin or not conn.reusable):
            self._drop()
            conn = None
        for attempt in (0, 1):
            if conn is None:
                try:
                    conn = await _Connection.open(origin)
                except OSError as exc:
                    raise PeerError(f"cannot connect to {origin[1]}:{origin[2]}: {exc}") from exc
                self.connects += 1
                self._conn = conn
            head = [("host", conn.host), *headers.items()]
            try:
                return await conn.request(target, head)
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
