"""Who may make a request, and how fast: authentication, authorisation, rate limits.

Both checks run before any handler, on the stream path alone (and, for a
fork, its source), so a refused request never reaches the store. A failed
authentication costs the address a request of its rate like any other, so
guessing tokens is as slow as the rate limit makes it.
"""

from __future__ import annotations

from stream_server.auth import Denied
from stream_server.protocol.context import Context
from stream_server.protocol.headers import (
    AUTHORIZATION,
    RETRY_AFTER,
    STREAM_FORKED_FROM,
    WWW_AUTHENTICATE,
)
from stream_server.protocol.http import Headers, text_headers
from stream_server.ratelimit import retry_after

Refusal = tuple[int, Headers, bytes]


async def admit(
    ctx: Context, client: str, method: str, path: str, h: dict[str, str]
) -> tuple[str, Refusal | None]:
    """The client's name (its token's, once authenticated), and a refusal if there is one."""
    if ctx.auth is not None:
        source = h.get(STREAM_FORKED_FROM.key) if method == "PUT" else None
        try:
            principal = ctx.auth.check(
                h.get(AUTHORIZATION.key),
                method,
                path,
                ctx.source_path(source) if source else None,
            )
        except Denied as exc:
            limited = await rate_limited(ctx, client) if exc.status == 401 else None
            if limited is not None:
                return client, limited
            extra: Headers = []
            if exc.status == 401:
                extra = [(WWW_AUTHENTICATE.raw, b'Bearer realm="durable-streams"')]
            return client, (exc.status, text_headers(extra), (exc.reason + "\n").encode())
        client = "token:" + principal.name
    return client, await rate_limited(ctx, client)


async def rate_limited(ctx: Context, client: str) -> Refusal | None:
    """A refusal once the client's rate is used up. Asynchronous: with worker processes
    every worker asks the one limiter the writer holds, so a client's rate is the same
    whichever worker its connections land on."""
    if ctx.limiter is None:
        return None
    wait = await ctx.limiter.admit(client)
    if wait <= 0:
        return None
    return (
        429,
        text_headers([(RETRY_AFTER.raw, retry_after(wait).encode())]),
        b"rate limit exceeded\n",
    )
