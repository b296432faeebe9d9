"""Reading a stream whole over HTTP, as a client catching up does (the tests' one way),
and what a client can observe of a stream, to show that a refused request changed nothing.

Each takes the client to read with: a server process's (none given: a new
``httpx.Client``) or an in-process server's (``testkit.asgi``'s ``http``).
"""

from __future__ import annotations

import hashlib

import httpx


def read_served(client: httpx.Client, url: str) -> bytes | None:
    """A stream's whole content, following Stream-Next-Offset until up to date; None when
    the server answers anything else than 200 (no such stream there, not serving yet)."""
    read = _read(client, url)
    return read if isinstance(read, bytes) else None


def read_all(url: str, *, timeout: float = 10, client: httpx.Client | None = None) -> bytes:
    """A stream's whole content, which the server must serve (200)."""
    if client is None:
        with httpx.Client(timeout=timeout) as c:
            read = _read(c, url)
    else:
        read = _read(client, url)
    assert isinstance(read, bytes), (
        f"{url} is not served: {read.status_code} at offset "
        f"{read.request.url.params.get('offset')}: {read.text[:200]!r}"
    )
    return read


def _read(client: httpx.Client, url: str) -> bytes | httpx.Response:
    """The content, or the first answer other than 200."""
    out, offset = b"", "-1"
    while True:
        r = client.get(url, params={"offset": offset})
        if r.status_code != 200:
            return r
        out += r.content
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out


def stream_state(url: str, client: httpx.Client | None = None) -> tuple[object, ...]:
    """Everything a client can observe of a stream: status, tail, closure, content hash."""
    h = client.head(url) if client is not None else httpx.head(url, timeout=10)
    body = read_all(url, client=client) if h.status_code == 200 else b""
    return (
        h.status_code,
        h.headers.get("stream-next-offset"),
        h.headers.get("stream-closed"),
        hashlib.sha256(body).hexdigest(),
    )
