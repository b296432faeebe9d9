"""Minimal ASGI plumbing for the hot path: header and query parsing, bodies, responses.

The stream routes speak raw ASGI rather than through framework objects: an
append is a few hundred microseconds of work, and per-request object churn
would be a measurable share of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from stream_server.protocol.headers import (
    ACCESS_CONTROL_ALLOW_HEADERS,
    ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS,
    ACCESS_CONTROL_MAX_AGE,
    AUTHORIZATION,
    CACHE_CONTROL,
    CONTENT_LENGTH,
    CONTENT_TYPE,
    CROSS_ORIGIN_RESOURCE_POLICY,
    ETAG,
    IF_NONE_MATCH,
    LAST_EVENT_ID,
    LOCATION,
    PRODUCER_EPOCH,
    PRODUCER_EXPECTED_SEQ,
    PRODUCER_ID,
    PRODUCER_RECEIVED_SEQ,
    PRODUCER_SEQ,
    RETRY_AFTER,
    STREAM_CLOSED,
    STREAM_CURSOR,
    STREAM_EARLIEST_OFFSET,
    STREAM_EXPIRES_AT,
    STREAM_FORK_OFFSET,
    STREAM_FORK_SUB_OFFSET,
    STREAM_FORKED_FROM,
    STREAM_NEXT_OFFSET,
    STREAM_SEQ,
    STREAM_SSE_DATA_ENCODING,
    STREAM_TTL,
    STREAM_UP_TO_DATE,
    X_CONTENT_TYPE_OPTIONS,
)
from stream_server.streams.errors import StreamError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

# The CORS lists: what a browser's script may read from a response, and send.
EXPOSED = ", ".join(
    h.name
    for h in (
        STREAM_NEXT_OFFSET,
        STREAM_CURSOR,
        STREAM_UP_TO_DATE,
        STREAM_CLOSED,
        STREAM_TTL,
        STREAM_EXPIRES_AT,
        ETAG,
        LOCATION,
        CONTENT_TYPE,
        PRODUCER_EPOCH,
        PRODUCER_SEQ,
        PRODUCER_EXPECTED_SEQ,
        PRODUCER_RECEIVED_SEQ,
        STREAM_SSE_DATA_ENCODING,
        RETRY_AFTER,
        STREAM_EARLIEST_OFFSET,
    )
)
ALLOWED_HEADERS = ", ".join(
    h.name
    for h in (
        CONTENT_TYPE,
        AUTHORIZATION,
        IF_NONE_MATCH,
        STREAM_TTL,
        STREAM_EXPIRES_AT,
        STREAM_SEQ,
        STREAM_CLOSED,
        STREAM_FORKED_FROM,
        STREAM_FORK_OFFSET,
        STREAM_FORK_SUB_OFFSET,
        PRODUCER_ID,
        PRODUCER_EPOCH,
        PRODUCER_SEQ,
        CACHE_CONTROL,
        LAST_EVENT_ID,
    )
)
ALLOWED_METHODS = "GET, HEAD, POST, PUT, DELETE, OPTIONS"

# On every response: CORS for browser clients, and the browser security headers.
COMMON: Headers = [
    (ACCESS_CONTROL_ALLOW_ORIGIN.raw, b"*"),
    (ACCESS_CONTROL_EXPOSE_HEADERS.raw, EXPOSED.encode()),
    (X_CONTENT_TYPE_OPTIONS.raw, b"nosniff"),
    (CROSS_ORIGIN_RESOURCE_POLICY.raw, b"cross-origin"),
]
PREFLIGHT: Headers = [
    (ACCESS_CONTROL_ALLOW_METHODS.raw, ALLOWED_METHODS.encode()),
    (ACCESS_CONTROL_ALLOW_HEADERS.raw, ALLOWED_HEADERS.encode()),
    (ACCESS_CONTROL_MAX_AGE.raw, b"86400"),
]


class PayloadTooLarge(StreamError):
    pass


class RequestTimeout(StreamError):
    """The client stopped sending its body: 408, and the connection is not kept."""


def request_headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


_QUERY = "stream_server.query"  # the scope's key for the parsed query


def socket_authority(scope: Scope, default: tuple[str, int | None]) -> str:
    """``host[:port]`` of the socket a request came in on, for a URL when the request
    names no Host: an IPv6 address in brackets (a dual-stack or IPv6-only bind)."""
    host, port = scope.get("server") or default
    name = f"[{host}]" if ":" in host else host
    return name if port is None else f"{name}:{port}"


def query_params(scope: Scope) -> dict[str, str]:
    """The query's fields, parsed once per request: a gated worker looks at them before
    the routes do (``workers/worker_app.py``), and the routes read the same dict."""
    params: dict[str, str] | None = scope.get(_QUERY)
    if params is None:
        qs = scope.get("query_string", b"")
        params = dict(parse_qsl(qs.decode("latin-1"), keep_blank_values=True)) if qs else {}
        scope[_QUERY] = params
    return params


async def read_body(  # noqa: C901 - the append path: a call more per append costs more than a branch
    receive: Receive,
    limit: int,
    declared: str | None,
    idle_timeout: float = 30.0,
    min_rate: int = 0,
) -> bytes:
    """The whole request body, refused with 413 as soon as it passes ``limit``.

    A body is cut off (408) when it stalls for ``idle_timeout`` seconds, or
    when it takes longer in all than ``idle_timeout`` plus one second per
    ``min_rate`` bytes received (Apache mod_reqtimeout's rule): a client that
    trickles a byte now and then would otherwise hold its request, and all it
    sent so far, forever. ``min_rate`` 0 keeps only the stall rule.
    """
    if declared is not None:
        try:
            if int(declared) > limit:
                raise PayloadTooLarge(f"request body larger than {limit} bytes")
        except ValueError:
            pass
    loop = asyncio.get_running_loop()
    started = loop.time()
    chunks: list[bytes] = []
    size = 0
    while True:
        now = loop.time()
        deadline = now + idle_timeout
        if min_rate:
            allowed = started + idle_timeout + size / min_rate
            if allowed <= now:
                raise RequestTimeout(f"request body slower than {min_rate} bytes/s")
            deadline = min(deadline, allowed)
        try:
            # One timer per chunk and no task: this is the hottest path.
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(
                f"request body stalled, or slower than {min_rate} bytes/s"
                if min_rate
                else f"request body stalled for {idle_timeout:g}s"
            ) from None
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("client went away")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body larger than {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


async def respond(
    send: Send, status: int, headers: Headers, body: bytes | memoryview = b""
) -> None:
    hs = [*COMMON, *headers]
    if body or status not in (204, 304):
        hs.append((CONTENT_LENGTH.raw, str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})


def text_headers(extra: Headers | None = None) -> Headers:
    hs: Headers = [
        (CONTENT_TYPE.raw, b"text/plain; charset=utf-8"),
        (CACHE_CONTROL.raw, b"no-store"),
    ]
    if extra:
        hs.extend(extra)
    return hs
