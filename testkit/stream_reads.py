"""Reading a stream whole over HTTP, as a client catching up does (the tests' one way)."""

from __future__ import annotations

import httpx


def read_served(client: httpx.Client, url: str) -> bytes | None:
    """A stream's whole content, following Stream-Next-Offset until up to date; None when
    the server answers anything else than 200 (no such stream there, not serving yet)."""
    out, offset = b"", "-1"
    while True:
        r = client.get(url, params={"offset": offset})
        if r.status_code != 200:
            return None
        out += r.content
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out
