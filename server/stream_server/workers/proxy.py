"""Requests a worker does not serve itself, passed whole to the writer's own HTTP socket.

Health, readiness, metrics, the replication and archive endpoints, the
subscriptions' ``__ds`` paths and (for now) every stream request of a replica
set's member: the writer's app answers them exactly as a single process would,
behind one more hop on a local socket. Bodies stream both ways, so a long-poll
or a large read through here holds no more than a chunk.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from stream_server.protocol.http import Receive, Scope, Send, respond, text_headers

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


class WriterProxy:
    """An HTTP client of the writer's Unix socket that relays whole requests."""

    def __init__(self, socket_path: Path) -> None:
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
            base_url="http://writer",
            timeout=httpx.Timeout(None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        has_body = any(
            k.lower() in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"]
        )
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        request = self.client.build_request(
            scope["method"],
            target.decode("latin-1"),
            headers=headers,
            content=_body(receive) if has_body else None,
        )
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("the writer did not answer %s %s: %s", scope["method"], scope["path"], exc)
            await respond(
                send, 503, text_headers([(b"retry-after", b"1")]), b"writer unavailable\n"
            )
            return
        try:
            relayed = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": relayed}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return
