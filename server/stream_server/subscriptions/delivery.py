"""The delivery loop: one task that turns pending work into wakes, on time.

It keeps a set of subscriptions to look at now (``kick``, called by the
store hooks and by every request that changes a subscription) and a heap
of deadlines (lease ends, retry times; ``schedule``). For every one due,
all at once so that their writes share group-commit batches, it calls
``step``: expire a lease that ran out, issue a wake when the
subscription is idle with pending work, write the change, then announce
the wake (a pull-wake event) or start its webhook delivery. A webhook POST
runs as a task of its own, bounded by a semaphore, so one slow receiver
never holds up the others; its outcome is applied only if its wake is
still the current one (a callback, a lease expiry or a deletion may have
ended it meanwhile). A failed delivery is retried at
``retry.next_delay(attempt)`` and the absolute time is written with the
wake, so a restarted server keeps the schedule it had.

Stopping is prompt: the loop and every webhook in flight are cancelled; a
wake cut short is simply delivered again after the restart (at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import time
from collections.abc import Callable

from stream_server.subscriptions import pullwake, tokens
from stream_server.subscriptions.manager import Ack, SubscriptionManager
from stream_server.subscriptions.retry import next_delay
from stream_server.subscriptions.signing import WebhookKeys
from stream_server.subscriptions.spec import WEBHOOK
from stream_server.subscriptions.state import Subscription, Wake
from stream_server.subscriptions.webhook_sender import Delivery, WebhookSender

log = logging.getLogger("stream_server.subscriptions")

MAX_CONCURRENT_DELIVERIES = 64
KEY_CHECK_SECONDS = 60.0


class DeliveryLoop:
    def __init__(
        self,
        manager: SubscriptionManager,
        sender: WebhookSender | None,
        *,
        callback_url: Callable[[Subscription], str],
        keys: WebhookKeys | None = None,
        key_rotation_interval: float = 0.0,
    ) -> None:
        self.m = manager
        self.sender = sender
        self.callback_url = callback_url
        self.keys = keys
        self.key_rotation_interval = key_rotation_interval
        self.due: set[str] = set()
        self.heap: list[tuple[float, str]] = []
        self.sending: dict[str, asyncio.Task[None]] = {}
        self.event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.limit = asyncio.Semaphore(MAX_CONCURRENT_DELIVERIES)
        manager.kick = self.kick
        manager.schedule = self.at

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        self.due.update(self.m.subs)
        self.task = asyncio.get_running_loop().create_task(self.run(), name="subscriptions")

    async def stop(self) -> None:
        tasks = [t for t in (self.task, *self.sending.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.sender is not None:
            await self.sender.aclose()

    def kick(self, sub_id: str) -> None:
        self.due.add(sub_id)
        self.event.set()

    def at(self, sub_id: str, when: float) -> None:
        heapq.heappush(self.heap, (when, sub_id))
        self.event.set()

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        next_key_check = time.monotonic() + KEY_CHECK_SECONDS
        while True:
            self.event.clear()
            now = self.m.clock()
            while self.heap and self.heap[0][0] <= now:
                self.due.add(heapq.heappop(self.heap)[1])
            due, self.due = self.due, set()
            # Together, so that their writes share group-commit batches.
            await asyncio.gather(*(self._step(sub_id) for sub_id in due))
            if self.keys is not None and time.monotonic() >= next_key_check:
                next_key_check = time.monotonic() + KEY_CHECK_SECONDS
                await self._check_keys()
            if self.due:
                continue
            timeout = KEY_CHECK_SECONDS
            if self.heap:
                timeout = min(timeout, max(0.0, self.heap[0][0] - self.m.clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.event.wait()

    async def _step(self, sub_id: str) -> None:
        try:
            await self.step(sub_id)
        except Exception:
            log.exception("subscription %s: delivery step failed", sub_id)
            self.at(sub_id, self.m.clock() + 1.0)

    async def step(self, sub_id: str) -> None:
        m = self.m
        sub = m.subs.get(sub_id)
        if sub is None:
            return
        now = m.clock()
        changed = m.expire_lease(sub, now) or sub_id in m.dirty
        new = None
        if sub.wake is None:
            new = m.issue_wake(sub, now)
            changed = changed or new is not None
        if changed:
            await m.save(sub)
        w = sub.wake
        if w is None:
            return
        if new is not None and sub.type != WEBHOOK:
            await pullwake.announce(m, sub, next(iter(new.snapshot)))
        if w.lease_until is not None:
            self.at(sub_id, w.lease_until)
        if sub.type == WEBHOOK and not w.delivered and sub_id not in self.sending:
            when = w.next_attempt_at or now
            if when <= now:
                self.sending[sub_id] = asyncio.get_running_loop().create_task(
                    self._deliver(sub, w), name=f"webhook {sub_id}"
                )
            else:
                self.at(sub_id, when)

    # ------------------------------------------------------------------ webhooks

    def body(self, sub: Subscription, w: Wake) -> bytes:
        return json.dumps(
            {
                "subscription_id": sub.id,
                "wake_id": w.id,
                "generation": w.generation,
                "streams": self.m.stream_infos(sub, w.snapshot),
                "callback_url": self.callback_url(sub),
                "callback_token": self.m.token(sub, tokens.CALLBACK),
            },
            separators=(",", ":"),
        ).encode()

    async def _deliver(self, sub: Subscription, w: Wake) -> None:
        try:
            async with self.limit:
                if self.sender is None:
                    result = Delivery(None, None, "webhooks are not configured")
                else:
                    assert sub.config.webhook_url is not None
                    result = await self.sender.send(sub.config.webhook_url, self.body(sub, w))
            await self._outcome(sub, w, result)
        finally:
            self.sending.pop(sub.id, None)

    async def _outcome(self, sub: Subscription, w: Wake, result: Delivery) -> None:
        m = self.m
        metrics = m.metrics
        if metrics is not None:
            metrics.subscription_deliveries.labels(result.outcome).inc()
        if m.subs.get(sub.id) is not sub or sub.wake is not w:
            return  # deleted, or the wake ended (callback, lease) while the POST ran
        now = m.clock()
        if result.ok:
            m.observe_wake_latency(sub.id)
            w.delivered = True
            w.attempt = 0
            w.next_attempt_at = None
            w.lease_until = now + sub.config.lease_ttl_ms / 1000
            if result.json is not None and result.json.get("done") is True:
                m.apply_acks(sub, [Ack(path, tail) for path, tail in w.snapshot.items()])
                m.finish_wake(sub)
            else:
                self.at(sub.id, w.lease_until)
        else:
            w.attempt += 1
            w.next_attempt_at = now + next_delay(w.attempt)
            if metrics is not None:
                metrics.subscription_retries.inc()
            log.warning(
                "subscription %s: webhook delivery %d failed (%s); next try in %.1fs",
                sub.id,
                w.attempt,
                result.error or f"status {result.status}",
                w.next_attempt_at - now,
            )
            self.at(sub.id, w.next_attempt_at)
        await m.save(sub)

    async def _check_keys(self) -> None:
        assert self.keys is not None
        try:
            kid = await asyncio.to_thread(self.keys.maybe_rotate, self.key_rotation_interval)
        except Exception:
            log.exception("webhook signing key check failed")
            return
        if kid is not None:
            log.info("webhook signing key rotated: now %s", kid)
