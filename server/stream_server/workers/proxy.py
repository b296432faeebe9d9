"""Requests a worker does not serve itself, passed whole to the writer's own HTTP socket.

Health, readiness, metrics, the replication and archive endpoints, the
subscriptions' ``__ds`` paths and (for now) every stream request of a replica
set's member: the writer's app answers them exactly as a single process would,
behind one more hop on a local socket. Bodies stream both ways, so a long-poll
or a large read through here holds no more than a chunk. A request for a protocol
switch (a standby's replication stream) is spliced instead (``tunnel.py``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from stream_server.protocol.http import Receive, Scope, Send, respond, text_headers
from stream_server.workers.tunnel import is_upgrade, tunnel

log = logging.getLogger("stream_server.workers")
logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per relayed request otherwise

# Headers of one connection, not of the request (RFC 9110, 7.6.1).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

# An answer's: the same, but ``Upgrade``, which a 426 must name (RFC 9110, 15.5.22) and
# which asks nothing of this hop in an answer.
HOP_ANSWER = HOP_BY_HOP - {b"upgrade"}

# Who sent a relayed request: the writer's app takes it as the request's client
# (``StreamServerApp.behind_workers``); the worker drops any a client sent itself.
CLIENT_HEADER = b"x-ds-worker-client"


class ClientGone(Exception):
    """The client hung up before its body was whole: raised out of the body being
    relayed, so that the relay's connection to the writer is closed mid-body (the
    writer's app then sees the request cut short, as a single process sees a client
    that hangs up, and takes nothing of it) and the request ends here quietly. Ending
    the body early instead left httpx short of the declared Content-Length, and the
    relay logged h11's LocalProtocolError as an ASGI application's exception."""


class WriterProxy:
    """An HTTP client of the writer's Unix socket that relays whole requests."""

    def __init__(self, transport: httpx.AsyncBaseTransport, socket: Path | None = None) -> None:
        self.socket = socket  # the writer's socket, for upgrades (``tunnel.py``); None: none
        self.client = httpx.AsyncClient(
            transport=transport,
            base_url="http://writer",
            timeout=httpx.Timeout(None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    @classmethod
    def on_socket(cls, path: Path) -> WriterProxy:
        return cls(httpx.AsyncHTTPTransport(uds=str(path)), path)

    async def close(self) -> None:
        await self.client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = _target(scope)
        if self.socket is not None and scope["type"] == "http" and is_upgrade(scope):
            # Its switch's own headers go along: the writer takes the switch (tunnel.py).
            head = b"%s %s HTTP/1.1\r\n" % (scope["method"].encode(), target)
            head += b"".join(b"%s: %s\r\n" % kv for kv in _forwarded(scope, frozenset()))
            take_over = scope.get("extensions", {}).get("stream_server.upgrade")
            try:
                await tunnel(send, self.socket, head + b"\r\n", take_over, HOP_ANSWER)
            except (OSError, TimeoutError, ValueError) as exc:
                await _unavailable(send, scope, exc)
            return
        headers = _forwarded(scope, HOP_BY_HOP)
        has_body = any(
            k.lower() in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"]
        )
        request = self.client.build_request(
            scope["method"],
            target.decode("latin-1"),
            headers=headers,
            content=_body(receive) if has_body else None,
        )
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _unavailable(send, scope, exc)
            return
        except ClientGone:  # an expected end: nobody is left to answer
            log.debug("a client hung up while its request was relayed: %s", scope["path"])
            return
        try:
            relayed = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_ANSWER]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": relayed}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


def _target(scope: Scope) -> bytes:
    target: bytes = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    return target


def _forwarded(scope: Scope, dropped: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """The request's headers but ``dropped``, and the client's address in ours (the
    writer's app counts the request against this client's limits)."""
    headers = [
        (k, v)
        for k, v in scope["headers"]
        if k.lower() not in dropped and k.lower() != CLIENT_HEADER
    ]
    client = scope.get("client")
    if client:
        headers.append((CLIENT_HEADER, str(client[0]).encode()))
    return headers


async def _unavailable(send: Send, scope: Scope, exc: Exception) -> None:
    log.warning("the writer did not answer %s %s: %s", scope["method"], scope["path"], exc)
    await respond(send, 503, text_headers([(b"retry-after", b"1")]), b"writer unavailable\n")


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    """The client's body as it arrives; ``ClientGone`` if it hangs up before the end."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return
