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
from typing import Any
from urllib.parse import unquote_to_bytes

from stream_server.auth import Denied
from stream_server.protocol import admission
from stream_server.protocol.context import Context
from stream_server.protocol.http import (
    PREFLIGHT,
    Headers,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
)
from stream_server.protocol.refusals import error_response
from stream_server.streams.errors import StreamError
from stream_server.subscriptions import pullwake
from stream_server.subscriptions.errors import SubscriptionError, invalid
from stream_server.subscriptions.service import Subscriptions
from stream_server.subscriptions.spec import check_id
from stream_server.subscriptions.urls import WebhookUrlRejected, check_webhook_url_resolving

MAX_CONTROL_BODY = 1024 * 1024
JSON_HEADERS: Headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
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
                "UNAVAILABLE", "subscriptions are not running", headers={"retry-after": "1"}
            )
        client = (scope.get("client") or ("?", 0))[0]
        if ctx.limiter is not None:
            limited = admission.rate_limited(ctx, client)
            if limited is not None:
                await respond(send, *limited)
                return
        status, body, extra = await _route(ctx, subs, scope, receive, method, raw_rest, h)
    except SubscriptionError as exc:
        status, body = exc.status, exc.body()
        extra = [(k.encode(), v.encode()) for k, v in exc.headers.items()]
    except Denied as exc:
        code = "UNAUTHORIZED" if exc.status == 401 else "FORBIDDEN"
        status, body, extra = exc.status, {"error": {"code": code, "message": exc.reason}}, []
        if exc.status == 401:
            extra = [(b"www-authenticate", b'Bearer realm="durable-streams"')]
    except StreamError as exc:
        status, headers, _ = error_response(exc)
        code = {400: "INVALID_REQUEST", 408: "REQUEST_TIMEOUT", 413: "PAYLOAD_TOO_LARGE"}.get(
            status, "UNAVAILABLE"
        )
        retry = [(k, v) for k, v in headers if k == b"retry-after"]
        status, body, extra = status, {"error": {"code": code, "message": exc.message}}, retry
    if status == 204:
        await respond(send, 204, [])
        return
    named = {k for k, _ in extra}
    headers = [*(h for h in JSON_HEADERS if h[0] not in named), *extra]
    await respond(send, status, headers, json.dumps(body).encode())


async def _route(
    ctx: Context,
    subs: Subscriptions,
    scope: Scope,
    receive: Receive,
    method: str,
    raw_rest: bytes,
    h: dict[str, str],
) -> tuple[int, Any, Headers]:
    parts = raw_rest.split(b"/")
    if parts == [b"__ds", b"jwks.json"]:
        _allow(method, "GET")
        assert subs.keys is not None
        return (
            200,
            subs.keys.jwks(),
            [
                (b"content-type", b"application/jwk-set+json"),
                (b"cache-control", b"public, max-age=300"),
            ],
        )
    if len(parts) < 3 or parts[1] != b"subscriptions" or not parts[2]:
        raise SubscriptionError("NOT_FOUND", "no such control path under __ds/")
    sub_id = check_id(_decode(parts[2], "subscription id"))
    tail = parts[3:]
    m = await subs.control(writing=method != "GET")  # a standby: a read-only copy
    origin = _origin(scope, h)
    auth = ctx.auth

    def need(scope_name: str, paths: list[str]) -> None:
        if auth is not None:
            principal = auth.identify(h.get("authorization"))
            for path in paths:
                if not principal.allows(scope_name, path):
                    raise Denied(403, f"token may not {scope_name} {path or 'every stream'!r}")

    if not tail:
        if method == "PUT":
            config = m.parse(await _json(receive, h))
            need("write", config.covered_paths())
            if m.existing(sub_id, config) is None and config.webhook_url is not None:
                try:
                    await check_webhook_url_resolving(config.webhook_url, subs.allow)
                except WebhookUrlRejected as exc:
                    raise SubscriptionError("WEBHOOK_URL_REJECTED", exc.reason) from None
            sub, created = await m.create(sub_id, config, origin=origin)
            if created:
                m.kick(sub.id)
            return 201 if created else 200, m.describe(sub, _signing(subs, sub, origin)), []
        if method == "GET":
            sub = m.get(sub_id) if auth is None else _authorised(m, sub_id, need, "read")
            return 200, m.describe(sub, _signing(subs, sub, origin)), []
        if method == "DELETE":
            if auth is not None and sub_id in m.subs:
                _authorised(m, sub_id, need, "write")
            elif auth is not None:
                need("write", [])  # only an unrestricted writer learns what does not exist
            await m.delete(sub_id)
            return 204, None, []
        _allow(method, "GET, PUT, DELETE")
    action = _decode(tail[0], "action")
    if action == "streams":
        if len(tail) == 1:
            _allow(method, "POST")
            body = await _json(receive, h)
            _authorised(m, sub_id, need, "write")
            if (
                auth is not None
                and isinstance(body, dict)
                and isinstance(body.get("streams"), list)
            ):
                need("write", [str(p).strip("/") for p in body["streams"]])
            await m.add_streams(sub_id, body)
            return 204, None, []
        _allow(method, "DELETE")
        path = _decode(b"/".join(tail[1:]), "stream path")
        _authorised(m, sub_id, need, "write")
        await m.remove_stream(sub_id, path)
        return 204, None, []
    if len(tail) != 1 or action not in ACTIONS:
        raise SubscriptionError("NOT_FOUND", "no such subscription path")
    _allow(method, "POST")
    body = await _json(receive, h)
    if action == "claim":
        _authorised(m, sub_id, need, "read")
        return 200, await pullwake.claim(m, sub_id, body), []
    token = _bearer(h)
    if action == "callback":
        return 200, await m.callback(sub_id, token, body), []
    if action == "ack":
        return 200, await pullwake.ack(m, sub_id, token, body), []
    await pullwake.release(m, sub_id, token, body)
    return 204, None, []


def _authorised(m: Any, sub_id: str, need: Any, scope_name: str) -> Any:
    sub = m.get(sub_id)
    need(scope_name, sub.config.covered_paths())
    return sub


def _signing(subs: Subscriptions, sub: Any, origin: str) -> dict[str, str] | None:
    return subs.signing(origin) if sub.config.webhook_url is not None else None


def _allow(method: str, allowed: str) -> None:
    if method not in [m.strip() for m in allowed.split(",")]:
        raise SubscriptionError("METHOD_NOT_ALLOWED", f"use {allowed}", headers={"allow": allowed})


def _decode(raw: bytes, what: str) -> str:
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise invalid(f"{what} is not valid percent-encoded UTF-8") from None


def _bearer(h: dict[str, str]) -> str | None:
    kind, _, token = h.get("authorization", "").strip().partition(" ")
    return token.strip() or None if kind.lower() == "bearer" else None


def _origin(scope: Scope, h: dict[str, str]) -> str:
    scheme = scope.get("scheme", "http")
    host = h.get("host", "")
    if not host or not set(host) <= HOST_CHARS:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    return f"{scheme}://{host}"


async def _json(receive: Receive, h: dict[str, str]) -> object:
    raw = await read_body(receive, MAX_CONTROL_BODY, h.get("content-length"))
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise invalid("the body is not valid JSON") from None
