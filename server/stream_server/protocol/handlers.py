"""The protocol's entry point: one ASGI app that routes each request to its operation.

``StreamRoutes`` is the public face (``app`` builds it over a ``Context``);
it does what every request needs, in order: a send that gives up on clients
that stop reading, the stream path (400 when malformed or past its length limits),
CORS preflight, admission (auth and rate limits), for a read (GET, HEAD) on a
replica set's member its read gate (503 while it cannot show that it is current:
``ReadGate``, docs/replication.md, "Reads"), then one handler per method. The reserved ``__ds`` paths go first, on their raw form, to
``subscriptions`` (which does its own admission). Each handler is a plain function over a
``Context`` in a module of its own (``create``: PUT, ``append``: POST,
``catch_up``: GET and HEAD, ``live_reads``: long-poll and SSE), and every
refusal they raise becomes a response in one place (``refusals``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from stream_server.declared.network import ProtocolSettings
from stream_server.protocol import admission, append, catch_up, create, subscriptions
from stream_server.protocol.context import Context, raw_path
from stream_server.protocol.headers import ALLOW
from stream_server.protocol.http import (
    PREFLIGHT,
    Headers,
    Receive,
    Scope,
    Send,
    request_headers,
    respond,
    text_headers,
)
from stream_server.protocol.paths import is_reserved
from stream_server.protocol.refusals import error_response
from stream_server.streams.errors import StreamError
from stream_server.subscriptions.service import Subscriptions

READS = frozenset({"GET", "HEAD"})


class StreamRoutes:
    """The ASGI app for everything below the stream base path."""

    def __init__(self, context: Context, subscriptions: Subscriptions | None = None) -> None:
        self.context = context
        self.subscriptions = subscriptions
        self.live_readers = self.context.slots.by_mode  # read by the metrics gauge
        self.admits = context.auth is not None or context.limiter is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: C901 - the protocol's order of checks, read in one place
        ctx = self.context
        method = scope["method"]
        send = _bounded(scope, send, ctx.settings.body_timeout)
        headers = request_headers(scope)
        client = (scope.get("client") or ("?", 0))[0]
        try:
            raw = raw_path(scope)
            if raw.startswith(ctx.base) and subscriptions.is_control(raw[len(ctx.base) :]):
                await subscriptions.handle(
                    ctx, self.subscriptions, scope, receive, send, raw[len(ctx.base) :], headers
                )
                return
            path = ctx.stream_path(raw)
            if method == "OPTIONS":
                await respond(send, 204, list(PREFLIGHT))
                return
            if self.admits:
                client, refusal = await admission.admit(ctx, client, method, path, headers)
                if refusal is not None:
                    await respond(send, *refusal)
                    return
            if is_reserved(path):  # a percent-encoded spelling of __ds
                await respond(
                    send, 400, text_headers(), b"__ds is reserved: spell it out literally\n"
                )
                return
            if method in READS and ctx.read_gate is not None:
                refusal = ctx.read_gate.read_refusal()
                if refusal is not None:
                    await respond(send, *refusal)
                    return
            if method not in METHODS:
                await respond(
                    send,
                    405,
                    text_headers([(ALLOW.raw, b"GET, HEAD, POST, PUT, DELETE, OPTIONS")]),
                    b"method not allowed\n",
                )
                return
            await METHODS[method](ctx, scope, receive, send, path, headers, client)
        except StreamError as exc:
            await respond(send, *error_response(exc))
        except (ConnectionAbortedError, OSError):
            return

    async def refuse(
        self, scope: Scope, send: Send, status: int, headers: Headers, reason: bytes
    ) -> None:
        """Send a refusal decided before the routes (a standby's refusal of a write): in
        the form the path's API gives its refusals, JSON on the ``__ds`` paths, text on
        the streams."""
        raw = raw_path(scope)
        base = self.context.base
        if raw.startswith(base) and subscriptions.is_control(raw[len(base) :]):
            await subscriptions.refuse(send, status, headers, reason)
        else:
            await respond(send, status, text_headers(headers), reason)


async def delete(
    ctx: Context,
    scope: Scope,
    receive: Receive,
    send: Send,
    path: str,
    h: dict[str, str],
    client: str,
) -> None:
    # The store decides everything (soft delete under live forks, cascades).
    await ctx.store.delete(path)
    await respond(send, 204, [])


Handler = Callable[[Context, Scope, Receive, Send, str, dict[str, str], str], Awaitable[None]]

# One handler per method, each in the module of its operation; the arguments are
# the same for all (what a handler does not need it ignores).
METHODS: dict[str, Handler] = {
    "GET": catch_up.get,
    "HEAD": catch_up.head,
    "POST": append.post,
    "PUT": create.put,
    "DELETE": delete,
}


def _bounded(scope: Scope, send: Send, timeout: float) -> Send:
    """A send that gives up on a client that stops reading, and drops the connection.

    Only streamed and large bodies can block on a full socket buffer; small
    complete responses are buffered by the transport at once, so they skip
    the timer (a streamed response's last, empty send does not). On a timeout
    the transport is aborted (when the server provides
    ``stream_server.abort``): closing it gracefully would keep the unread
    megabytes buffered until the client read them, which it never will.
    """
    abort = scope.get("extensions", {}).get("stream_server.abort")
    streamed = False

    async def bounded(message: MutableMapping[str, Any]) -> None:
        nonlocal streamed
        if message["type"] != "http.response.body" or not (
            streamed or message.get("more_body") or len(message.get("body", b"")) >= 65536
        ):
            await send(message)
            return
        streamed = True
        try:
            async with asyncio.timeout(timeout):
                await send(message)
        except TimeoutError:
            if abort is not None:
                abort()
            raise ConnectionAbortedError("client stopped reading") from None

    return bounded


__all__ = ["Context", "ProtocolSettings", "StreamRoutes"]
