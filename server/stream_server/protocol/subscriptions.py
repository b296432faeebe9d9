"""The reserved ``__ds`` paths: subscription control, delivery callbacks and the JWKS.

Routed before anything treats the path as a stream (section 6), and on the
raw path: a stream path inside a membership URL is percent-encoded and may
hold ``%2F``, which stream paths refuse. Every answer is JSON; every
refusal is ``{"error": {"code", "message"}}`` with the code section 7 names.

Access, when bearer tokens are configured (``--auth-tokens-file``): the
JWKS is public; creating, changing or deleting a subscription needs
``write`` on every path it covers (its pattern's literal prefix, each
explicit stream, the wake stream), reading one or claiming its lease needs
``read`` on them (a worker that may read the streams may process them);
``callback``, ``ack`` and ``release`` take only the token the server issued
for the current wake, never a service token. ``admin`` includes the rest.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

from stream_server.auth import Denied
from stream_server.protocol import admission
from stream_server.protocol.context import Context
from stream_server.protocol.headers import (
    ALLOW,
    AUTHORIZATION,
    CACHE_CONTROL,
    CONTENT_LENGTH,
    CONTENT_TYPE,
    HOST,
    RETRY_AFTER,
    WWW_AUTHENTICATE,
)
from stream_server.protocol.http import (
    PREFLIGHT,
    Headers,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
    socket_authority,
)
from stream_server.protocol.refusals import error_response
from stream_server.streams.errors import StreamError
from stream_server.subscriptions import pullwake
from stream_server.subscriptions.manager import SubscriptionManager
from stream_server.subscriptions.service import Subscriptions
from stream_server.subscriptions.spec import check_id, check_new_id
from stream_server.subscriptions.state import Subscription
from stream_server.subscriptions.subscription_errors import SubscriptionError, invalid
from stream_server.subscriptions.urls import WebhookUrlRejected, check_webhook_url_resolving

MAX_CONTROL_BODY = 1024 * 1024
JSON_HEADERS: Headers = [(CONTENT_TYPE.raw, b"application/json"), (CACHE_CONTROL.raw, b"no-store")]
ACTIONS = ("callback", "claim", "ack", "release")
HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]")


def is_control(raw_rest: bytes) -> bool:
    return raw_rest == b"__ds" or raw_rest.startswith(b"__ds/")


async def handle(
    ctx: Context,
    subs: Subscriptions | None,
    scope: Scope,
    receive: Receive,
    send: Send,
    raw_rest: bytes,
    h: dict[str, str],
) -> None:
    method = scope["method"]
    if method == "OPTIONS":
        await respond(send, 204, list(PREFLIGHT))
        return
    try:
        if subs is None or not subs.started:
            raise SubscriptionError(
                "UNAVAILABLE", "subscriptions are not running", headers={RETRY_AFTER.key: "1"}
            )
        client = (scope.get("client") or ("?", 0))[0]
        if ctx.limiter is not None:
            limited = await admission.rate_limited(ctx, client)
            if limited is not None:
                await respond(send, *limited)
                return
        status, body, extra = await _route(ctx, subs, scope, receive, method, raw_rest, h)
    except SubscriptionError as exc:
        status, body = exc.status, exc.body()
        extra = [(k.encode(), v.encode()) for k, v in exc.headers.items()]
    except Denied as exc:
        code = "UNAUTHORIZED" if exc.status == 401 else "FORBIDDEN"
        status, body, extra = exc.status, _error(code, exc.reason), []
        if exc.status == 401:
            extra = [(WWW_AUTHENTICATE.raw, b'Bearer realm="durable-streams"')]
    except StreamError as exc:
        status, headers, _ = error_response(exc)
        retry = [(k, v) for k, v in headers if k == RETRY_AFTER.raw]
        status, body, extra = status, _error(_code(status), exc.message), retry
    await _answer(send, status, body, extra)


async def refuse(send: Send, status: int, headers: Headers, reason: bytes) -> None:
    """A refusal decided before the control API is reached (a standby's refusal of a
    write, ``app.py``), in the API's own form: every refusal on the ``__ds`` paths is
    JSON (docs/subscriptions.md), with the refusal's headers (Retry-After,
    Stream-Primary)."""
    message = reason.decode("utf-8", "replace").strip()
    await _answer(send, status, _error(_code(status), message), headers)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _code(status: int) -> str:
    """Section 7's code for a refusal that arrives as a status alone."""
    return {400: "INVALID_REQUEST", 408: "REQUEST_TIMEOUT", 413: "PAYLOAD_TOO_LARGE"}.get(
        status, "UNAVAILABLE"
    )


async def _answer(send: Send, status: int, body: object, extra: Headers) -> None:
    if status == 204:
        await respond(send, 204, [])
        return
    named = {k for k, _ in extra}
    headers = [*(h for h in JSON_HEADERS if h[0] not in named), *extra]
    await respond(send, status, headers, json.dumps(body).encode())


Answer = tuple[int, Any, Headers]


class Call:
    """One control request on one subscription, as its handler sees it."""

    def __init__(
        self,
        ctx: Context,
        subs: Subscriptions,
        m: SubscriptionManager,
        scope: Scope,
        receive: Receive,
        h: dict[str, str],
        sub_id: str,
        tail: list[bytes],
    ) -> None:
        self.subs = subs
        self.m = m
        self.receive = receive
        self.h = h
        self.sub_id = sub_id
        self.tail = tail
        self.auth = ctx.auth
        self.origin = _origin(scope, h)

    def need(self, scope_name: str, paths: list[str]) -> None:
        """With auth on: 403 unless the request's token may ``scope_name`` every path."""
        if self.auth is not None:
            principal = self.auth.identify(self.h.get(AUTHORIZATION.key))
            for path in paths:
                if not principal.allows(scope_name, path):
                    raise Denied(403, f"token may not {scope_name} {path or 'every stream'!r}")

    def authorised(self, scope_name: str) -> Subscription:
        """The subscription, once the token may ``scope_name`` every path it covers."""
        sub = self.m.get(self.sub_id)
        self.need(scope_name, sub.config.covered_paths())
        return sub

    def described(self, sub: Subscription) -> dict[str, Any]:
        signing = self.subs.signing(self.origin) if sub.config.webhook_url is not None else None
        return self.m.describe(sub, signing)

    async def body(self) -> object:
        return await _json(self.receive, self.h)


async def _put(c: Call) -> Answer:
    sub_id = check_new_id(c.sub_id)
    config = c.m.parse(await c.body())
    c.need("write", config.covered_paths())
    if c.m.existing(sub_id, config) is None and config.webhook_url is not None:
        try:
            await check_webhook_url_resolving(config.webhook_url, c.subs.allow)
        except WebhookUrlRejected as exc:
            raise SubscriptionError("WEBHOOK_URL_REJECTED", exc.reason) from None
    sub, created = await c.m.create(sub_id, config, origin=c.origin)
    if created:
        c.m.kick(sub.id)
    return 201 if created else 200, c.described(sub), []


async def _get(c: Call) -> Answer:
    sub = c.m.get(c.sub_id) if c.auth is None else c.authorised("read")
    await c.m.settled(sub.id)  # what it shows is durable (a failed delivery, say)
    return 200, c.described(sub), []


async def _delete(c: Call) -> Answer:
    if c.auth is not None and c.sub_id in c.m.subs:
        c.authorised("write")
    elif c.auth is not None:
        c.need("write", [])  # only an unrestricted writer learns what does not exist
    await c.m.delete(c.sub_id)
    return 204, None, []


async def _add_streams(c: Call) -> Answer:
    body = await c.body()
    c.authorised("write")
    if c.auth is not None and isinstance(body, dict) and isinstance(body.get("streams"), list):
        c.need("write", [str(p).strip("/") for p in body["streams"]])
    await c.m.add_streams(c.sub_id, body)
    return 204, None, []


async def _remove_stream(c: Call) -> Answer:
    path = _decode(b"/".join(c.tail[1:]), "stream path")
    c.authorised("write")
    await c.m.remove_stream(c.sub_id, path)
    return 204, None, []


async def _claim(c: Call) -> Answer:
    body = await c.body()
    c.authorised("read")
    return 200, await pullwake.claim(c.m, c.sub_id, body), []


async def _callback(c: Call) -> Answer:
    body = await c.body()
    return 200, await c.m.callback(c.sub_id, _bearer(c.h), body), []


async def _ack(c: Call) -> Answer:
    body = await c.body()
    return 200, await pullwake.ack(c.m, c.sub_id, _bearer(c.h), body), []


async def _release(c: Call) -> Answer:
    body = await c.body()
    await pullwake.release(c.m, c.sub_id, _bearer(c.h), body)
    return 204, None, []


Handler = Callable[[Call], Awaitable[Answer]]

# What follows ``__ds/subscriptions/ID`` -> method -> handler; the methods listed in
# the order the Allow header of a 405 names them.
ROUTES: dict[str, dict[str, Handler]] = {
    "": {"GET": _get, "PUT": _put, "DELETE": _delete},
    "streams": {"POST": _add_streams},
    "streams/PATH": {"DELETE": _remove_stream},
    "callback": {"POST": _callback},
    "claim": {"POST": _claim},
    "ack": {"POST": _ack},
    "release": {"POST": _release},
}


async def _route(
    ctx: Context,
    subs: Subscriptions,
    scope: Scope,
    receive: Receive,
    method: str,
    raw_rest: bytes,
    h: dict[str, str],
) -> Answer:
    parts = raw_rest.split(b"/")
    if parts == [b"__ds", b"jwks.json"]:
        _allow(method, {"GET": None})
        assert subs.keys is not None
        jwks_headers = [
            (CONTENT_TYPE.raw, b"application/jwk-set+json"),
            (CACHE_CONTROL.raw, b"public, max-age=300"),
        ]
        return 200, subs.keys.jwks(), jwks_headers
    if len(parts) < 3 or parts[1] != b"subscriptions" or not parts[2]:
        raise SubscriptionError("NOT_FOUND", "no such control path under __ds/")
    sub_id = check_id(_decode(parts[2], "subscription id"))
    tail = parts[3:]
    m = await subs.control(writing=method != "GET")  # a standby: a read-only copy
    methods = ROUTES[_resource(tail)]
    _allow(method, methods)
    return await methods[method](Call(ctx, subs, m, scope, receive, h, sub_id, tail))


def _resource(tail: list[bytes]) -> str:
    """The ``ROUTES`` key of what follows the subscription id (404 when there is none)."""
    if not tail:
        return ""
    action = _decode(tail[0], "action")
    if action == "streams":
        return "streams" if len(tail) == 1 else "streams/PATH"
    if len(tail) != 1 or action not in ACTIONS:
        raise SubscriptionError("NOT_FOUND", "no such subscription path")
    return action


def _allow(method: str, methods: Mapping[str, object]) -> None:
    if method not in methods:
        allowed = ", ".join(methods)
        raise SubscriptionError(
            "METHOD_NOT_ALLOWED", f"use {allowed}", headers={ALLOW.key: allowed}
        )


def _decode(raw: bytes, what: str) -> str:
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise invalid(f"{what} is not valid percent-encoded UTF-8") from None


def _bearer(h: dict[str, str]) -> str | None:
    kind, _, token = h.get(AUTHORIZATION.key, "").strip().partition(" ")
    return token.strip() or None if kind.lower() == "bearer" else None


def _origin(scope: Scope, h: dict[str, str]) -> str:
    scheme = scope.get("scheme", "http")
    host = h.get(HOST.key, "")
    if not host or not set(host) <= HOST_CHARS:
        host = socket_authority(scope, ("127.0.0.1", 80))
    return f"{scheme}://{host}"


async def _json(receive: Receive, h: dict[str, str]) -> object:
    raw = await read_body(receive, MAX_CONTROL_BODY, h.get(CONTENT_LENGTH.key))
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise invalid("the body is not valid JSON") from None
