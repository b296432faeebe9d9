"""Pull-wake (section 7.2): wake events on a stream, and a lease that one worker claims.

A wake is announced by appending a JSON event to the subscription's wake
stream through the store, like any client append, so every reader of that
stream (long-poll, SSE, catch-up) sees it and it is as durable as any data.
Workers race to ``claim``; the winner holds a lease of ``lease_ttl_ms``,
kept alive by ``ack`` without ``done``, ended by ``ack`` with ``done`` or by
``release``. When the lease ends with work still pending the delivery loop
issues a new generation and appends a new event, so a crashed worker's
streams are always offered again.

A claim with no wake outstanding but pending work (the worker came before
the event did) issues the wake itself: a worker never waits for an event
it does not need.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from stream_server.streams.errors import StreamError
from stream_server.streams.requests import AppendRequest
from stream_server.subscriptions import tokens
from stream_server.subscriptions.manager import SubscriptionManager
from stream_server.subscriptions.spec import PULL_WAKE
from stream_server.subscriptions.state import Subscription
from stream_server.subscriptions.subscription_errors import SubscriptionError, invalid

log = logging.getLogger("stream_server.subscriptions")

MAX_WORKER_CHARS = 256
JSON_TYPE = "application/json"


def _pull_wake(m: SubscriptionManager, sub_id: str) -> Subscription:
    sub = m.get(sub_id)
    if sub.type != PULL_WAKE:
        raise invalid("this is a webhook subscription: claim, ack and release are for pull-wake")
    return sub


async def claim(m: SubscriptionManager, sub_id: str, body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    worker = body.get("worker")
    if not isinstance(worker, str) or not worker or len(worker) > MAX_WORKER_CHARS:
        raise invalid(f"worker must be a string of 1 to {MAX_WORKER_CHARS} characters")
    sub = _pull_wake(m, sub_id)
    now = m.clock()
    expired = m.expire_lease(sub, now)
    w = sub.wake
    if w is not None and w.holder is not None:
        raise SubscriptionError(
            "ALREADY_CLAIMED",
            "another worker holds the lease",
            current_holder=w.holder,
            generation=sub.generation,
        )
    if w is None:
        w = m.issue_wake(sub, now)
        if w is None:
            if expired:
                await m.save(sub)
            raise SubscriptionError(
                "NO_PENDING_WORK", "no stream of this subscription has new data"
            )
    w.holder = worker
    w.lease_until = now + sub.config.lease_ttl_ms / 1000
    await m.save(sub)
    m.schedule(sub.id, w.lease_until)
    m.observe_wake_latency(sub.id)
    if m.metrics is not None:
        m.metrics.subscription_claims.inc()
    return {
        "wake_id": w.id,
        "generation": sub.generation,
        "token": m.token(sub, tokens.CLAIM),
        "streams": m.stream_infos(sub, w.snapshot),
        "lease_ttl_ms": sub.config.lease_ttl_ms,
    }


async def ack(
    m: SubscriptionManager, sub_id: str, token: str | None, body: object
) -> dict[str, Any]:
    """Acks, and a heartbeat: without ``done`` the lease is extended, with it released."""
    sub = m.check_wake(sub_id, token, body, tokens.CLAIM)
    _pull_wake(m, sub_id)
    assert isinstance(body, dict)
    return await m.acknowledge(sub, body)


async def release(m: SubscriptionManager, sub_id: str, token: str | None, body: object) -> None:
    sub = m.check_wake(sub_id, token, body, tokens.CLAIM)
    _pull_wake(m, sub_id)
    m.finish_wake(sub)
    await m.save(sub)


async def announce(m: SubscriptionManager, sub: Subscription, stream: str) -> bool:
    """Append the wake event for the current generation to the wake stream."""
    wake_stream = sub.config.wake_stream
    assert wake_stream is not None
    event = {
        "type": "wake",
        "subscription_id": sub.id,
        "stream": stream,
        "generation": sub.generation,
        "ts": int(m.clock() * 1000),
    }
    s = m.store.streams.get(wake_stream)
    if s is None or not s.committed:
        log.warning("subscription %s: wake stream %r does not exist", sub.id, wake_stream)
        return False
    content_type = s.meta.content_type
    body = json.dumps(event, separators=(",", ":")).encode()
    if not s.is_json:
        body += b"\n"
    try:
        await m.store.append(AppendRequest(wake_stream, content_type, body))
    except StreamError as exc:
        log.warning("subscription %s: wake event not written to %r: %s", sub.id, wake_stream, exc)
        return False
    m.observe_wake_latency(sub.id)
    return True
