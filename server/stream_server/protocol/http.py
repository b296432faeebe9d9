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

from stream_server.streams.errors import StreamError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

EXPOSED = (
    "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, "
    "Stream-Expires-At, ETag, Location, Content-Type, Producer-Epoch, Producer-Seq, "
    "Producer-Expected-Seq, Producer-Received-Seq, Stream-SSE-Data-Encoding, Retry-After, "
    "Stream-Earliest-Offset"
)
ALLOWED_HEADERS = (
    "Content-Type, Authorization, If-None-Match, Stream-TTL, Stream-Expires-At, Stream-Seq, "
    "Stream-Closed, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset, "
    "Producer-Id, Producer-Epoch, Producer-Seq, Cache-Control, Last-Event-ID"
)
ALLOWED_METHODS = "GET, HEAD, POST, PUT, DELETE, OPTIONS"

# On every response: CORS for browser clients, and the browser security headers.
COMMON: Headers = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-expose-headers", EXPOSED.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"cross-origin"),
]
PREFLIGHT: Headers = [
    (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
    (b"access-control-allow-headers", ALLOWED_HEADERS.encode()),
    (b"access-control-max-age", b"86400"),
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


def query_params(scope: Scope) -> dict[str, str]:
    qs = scope.get("query_string", b"")
    if not qs:
        return {}
    return dict(parse_qsl(qs.decode("latin-1"), keep_blank_values=True))


async def read_body(
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
        hs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})


def text_headers(extra: Headers | None = None) -> Headers:
    hs: Headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store")]
    if extra:
        hs.extend(extra)
    return hs
