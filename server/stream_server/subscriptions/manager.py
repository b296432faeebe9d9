"""The subscription manager: every subscription's state, and every change to it.

Design. All state lives on the event loop in plain objects (``state.py``)
and changes synchronously, so a check and the change it guards never
interleave with another request; each change is then written as the
subscription's whole value (``saved.py``) before the request that caused
it is answered. The manager never sleeps or sends: it says which
subscriptions need attention (``kick``) and the delivery loop
(``delivery.py``) calls ``step`` on them, which expires leases, issues wakes
and hands webhooks to the sender; pull-wake claims, acks and releases are in
``pullwake.py``.

It is one module on purpose: links, cursors, wakes and saved values change
together in one synchronous step (a check and its change must not interleave
with another request), and splitting them would spread that invariant over
modules that each hold half of it.

Streams reach the manager through the store's hooks, which run when a batch
is durable: a created stream that matches a pattern is linked at its first
offset before anything else can happen, so its first data is pending; an
append kicks every subscription linking the stream. Pending work is always
computed from the store's committed tails against the cursors, never
counted, so a lost kick can delay a wake but never lose one: ``start``
kicks every subscription, and every lease and retry deadline kicks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stream_format.offsets import START, OffsetError, format_offset, parse_offset
from stream_server.metrics import Metrics
from stream_server.streams.clock import WALL_CLOCK, Clock
from stream_server.streams.interface import SubscriptionStore
from stream_server.streams.model import Stream
from stream_server.subscriptions import tokens
from stream_server.subscriptions.saved import SavedSubscriptions
from stream_server.subscriptions.spec import (
    PULL_WAKE,
    WEBHOOK,
    SubscriptionConfig,
    check_id,
    parse_config,
    stream_list,
    stream_path,
)
from stream_server.subscriptions.state import (
    Subscription,
    Tombstone,
    Wake,
    from_value,
)
from stream_server.subscriptions.subscription_errors import (
    SubscriptionError,
    fenced,
    invalid,
    not_found,
)

log = logging.getLogger("stream_server.subscriptions")

# One wake names at most this many pending streams; the rest come in the next wake.
MAX_WAKE_STREAMS = 1000
MAX_ACKS = 10_000
TOMBSTONE_DAYS = 7


@dataclass(slots=True)
class Ack:
    path: str
    unit: int


class SubscriptionManager:
    def __init__(
        self,
        store: SubscriptionStore,
        *,
        max_path_bytes: int = 1024,
        max_subscriptions: int = 10_000,
        metrics: Metrics | None = None,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        self.store = store
        self.saved = SavedSubscriptions(store)
        self.max_path_bytes = max_path_bytes
        self.max_subscriptions = max_subscriptions
        self.metrics = metrics
        self.clock = clock
        self.subs: dict[str, Subscription] = {}
        self.tombstones: dict[str, Tombstone] = {}
        self.by_stream: dict[str, set[str]] = {}  # path -> ids of subscriptions linking it
        self.dirty: set[str] = set()  # changed by a hook, not yet written
        self._writing: dict[str, asyncio.Future[None]] = {}  # each one's last write, until durable
        self.pending_since: dict[str, float] = {}  # id -> monotonic time work became pending
        self.kick: Callable[[str], None] = lambda sub_id: None  # set by the delivery loop
        self.schedule: Callable[[str, float], None] = lambda sub_id, when: None

    # ------------------------------------------------------------------ start-up

    def reset(self) -> None:
        """Forget every subscription, so that ``load`` starts from the saved values alone (a
        replica promoted to primary: its values arrived in replicated frames)."""
        self.subs.clear()
        self.tombstones.clear()
        self.by_stream.clear()
        self.dirty.clear()
        self.pending_since.clear()
        self.kick = lambda sub_id: None
        self.schedule = lambda sub_id, when: None

    async def load(self, *, prune: bool = True) -> None:
        """Read every saved subscription; link streams created while the server was down.

        ``prune`` removes tombstones past their time; a read-only copy (a standby
        answering reads) keeps them, since it may not write.
        """
        now = self.clock()
        for key, raw in self.saved.load().items():
            try:
                item = from_value(raw, max_path_bytes=self.max_path_bytes)
            except ValueError as exc:
                log.error("subscription %r is not served: %s", key, exc)
                continue
            if isinstance(item, Tombstone):
                await self._load_tombstone(key, item, now if prune else None)
                continue
            self.subs[item.id] = item
            for path in item.links:
                self.by_stream.setdefault(path, set()).add(item.id)
        for sub in self.subs.values():
            self._relink(sub)
        if self.subs:
            log.info("%d subscriptions loaded", len(self.subs))

    async def _load_tombstone(self, key: str, item: Tombstone, now: float | None) -> None:
        """Keep a tombstone, or (``now`` given) remove it once past its time."""
        if now is not None and now - item.deleted_at > TOMBSTONE_DAYS * 86400:
            try:
                await self.saved.put(key, None)
                return
            except Exception as exc:  # e.g. a new primary not yet in sync
                log.warning("old tombstone %r kept for now: %s", key, exc)
        self.tombstones[item.id] = item

    def _relink(self, sub: Subscription) -> None:
        """Bring a loaded subscription's glob links up to the streams as they are now:
        drop those of streams deleted meanwhile, add those of streams created."""
        for path, link in list(sub.links.items()):
            if not link.explicit and path not in self.store.streams:
                self._unlink(sub, path)  # a glob link of a stream deleted meanwhile
        if sub.config.pattern is None:
            return
        for s in list(self.store.streams.values()):
            if s.path not in sub.links and self._globbed(sub, s):
                # Created after the subscription: everything in it is new.
                start = s.meta.fork_offset if s.meta.created_at >= sub.created_at else s.tail
                self._link(sub, s.path, start, glob=True)

    # ------------------------------------------------------------------ queries

    def tail(self, path: str) -> int:
        s = self.store.streams.get(path)
        if s is None or not s.committed or s.meta.soft_deleted:
            return 0
        return int(s.tail)

    def pending(self, sub: Subscription) -> list[tuple[str, int, int]]:
        """(path, acked, tail) of every linked stream with data past its cursor."""
        out = []
        for link in sub.links.values():
            t = self.tail(link.path)
            if t > link.acked:
                out.append((link.path, link.acked, t))
        return out

    def has_pending(self, sub: Subscription) -> bool:
        return any(self.tail(link.path) > link.acked for link in sub.links.values())

    def pending_stream_count(self) -> int:
        """For the metrics gauge, read on the scrape's thread: a change under it is
        answered with a retry, not a wrong count."""
        for _ in range(3):
            try:
                return sum(len(self.pending(sub)) for sub in list(self.subs.values()))
            except RuntimeError:  # a dict changed size while we read it
                continue
        return 0

    def failing_count(self) -> int:
        return sum(1 for sub in list(self.subs.values()) if sub.status == "failed")

    def get(self, sub_id: str) -> Subscription:
        sub = self.subs.get(sub_id)
        if sub is None:
            raise not_found(sub_id)
        return sub

    def stream_infos(self, sub: Subscription, snapshot: dict[str, int]) -> list[dict[str, Any]]:
        out = []
        for path, tail in snapshot.items():
            link = sub.links.get(path)
            if link is None:
                continue
            out.append(
                {
                    "path": path,
                    "link_type": link.link_type,
                    "acked_offset": format_offset(link.acked),
                    "tail_offset": format_offset(tail),
                    "has_pending": tail > link.acked,
                }
            )
        return out

    def describe(self, sub: Subscription, signing: dict[str, str] | None) -> dict[str, Any]:
        c = sub.config
        return {
            "id": sub.id,
            "subscription_id": sub.id,
            "type": c.type,
            "pattern": c.pattern.text if c.pattern else None,
            "streams": [
                {
                    "path": link.path,
                    "link_type": link.link_type,
                    "acked_offset": format_offset(link.acked),
                }
                for link in sub.links.values()
            ],
            "webhook": None
            if c.webhook_url is None
            else {"url": c.webhook_url, **({"signing": signing} if signing else {})},
            "wake_stream": c.wake_stream,
            "lease_ttl_ms": c.lease_ttl_ms,
            "created_at": iso(sub.created_at),
            "status": sub.status,
            "description": c.description,
            "generation": sub.generation,
        }

    # ------------------------------------------------------------------ control

    def parse(self, body: object) -> SubscriptionConfig:
        return parse_config(body, max_path_bytes=self.max_path_bytes)

    def existing(self, sub_id: str, config: SubscriptionConfig) -> Subscription | None:
        """The subscription to re-confirm (same configuration), None when there is none;
        409 when one exists with a different configuration."""
        sub = self.subs.get(check_id(sub_id))
        if sub is None:
            return None
        if sub.config_hash != config.hash():
            raise SubscriptionError(
                "SUBSCRIPTION_ALREADY_EXISTS",
                f"subscription {sub_id!r} exists with a different configuration",
            )
        return sub

    async def create(
        self, sub_id: str, config: SubscriptionConfig, *, origin: str = ""
    ) -> tuple[Subscription, bool]:
        """Create (True) or re-confirm (False). Existing streams are linked at their tail."""
        sub = self.existing(sub_id, config)
        if sub is not None:
            return sub, False
        if len(self.subs) >= self.max_subscriptions:
            # Retry-After as for the stream limit: a deletion may free a place at any time.
            raise SubscriptionError(
                "UNAVAILABLE", "subscription limit reached", headers={"retry-after": "1"}
            )
        now = self.clock()
        tomb = self.tombstones.get(sub_id)
        sub = Subscription(
            id=sub_id,
            config=config,
            config_hash=config.hash(),
            created_at=now,
            secret=tokens.new_secret(),
            origin=origin,
            generation=tomb.generation if tomb else 0,
        )
        for path in config.streams:
            self._link(sub, path, self.tail(path), explicit=True)
        if config.pattern is not None:
            for s in list(self.store.streams.values()):
                if self._globbed(sub, s):
                    self._link(sub, s.path, s.tail, glob=True)
        self.subs[sub_id] = sub
        try:
            await self.saved.put(sub_id, sub.to_value())
        except Exception:
            self._forget(sub)
            raise
        self.tombstones.pop(sub_id, None)
        self._count()
        return sub, True

    async def delete(self, sub_id: str) -> None:
        sub = self.subs.get(sub_id)
        if sub is None:
            if sub_id in self.tombstones:
                return
            raise not_found(sub_id)
        tomb = Tombstone(sub_id, sub.generation, self.clock())
        self._forget(sub)
        self.tombstones[sub_id] = tomb
        await self.saved.put(sub_id, tomb.to_value())
        self._count()

    async def add_streams(self, sub_id: str, body: object) -> None:
        sub = self.get(sub_id)
        if not isinstance(body, dict) or "streams" not in body:
            raise invalid('the body must be {"streams": [...]}')
        paths = stream_list(body["streams"], max_bytes=self.max_path_bytes)
        if not paths:
            raise invalid("streams is empty")
        if sub.config.wake_stream in paths:
            raise invalid("the wake stream cannot be one of the subscription's streams")
        changed = False
        for path in paths:
            changed = self._link(sub, path, self.tail(path), explicit=True) or changed
        if changed:
            await self.save(sub)
            self.kick(sub.id)

    async def remove_stream(self, sub_id: str, raw_path: str) -> None:
        sub = self.get(sub_id)
        path = stream_path(raw_path, "the stream path", max_bytes=self.max_path_bytes)
        link = sub.links.get(path)
        if link is None or not link.explicit:
            return
        link.explicit = False
        if not link.glob:
            self._unlink(sub, path)
        await self.save(sub)

    # ------------------------------------------------------------------ store hooks

    def stream_created(self, s: Stream) -> None:
        """Link a new matching stream at its first offset, so its first data is pending.

        The link is not written here: ``load`` rebuilds it after a crash (a stream
        younger than the subscription is linked at its first offset), and the next
        wake or ack writes it anyway; writing a value that links thousands of
        streams on every create would cost far more than the link.
        """
        start = s.meta.fork_offset
        for sub in self.subs.values():
            if self._globbed(sub, s):
                self._link(sub, s.path, start, glob=True)
        self.stream_appended(s)

    def stream_appended(self, s: Stream) -> None:
        ids = self.by_stream.get(s.path)
        if not ids:
            return
        started = time.monotonic()
        for sub_id in ids:
            self.pending_since.setdefault(sub_id, started)
            self.kick(sub_id)

    def stream_deleted(self, path: str, reason: str) -> None:
        """A deleted stream's glob links go; an explicit link stays, its cursor reset,
        since a stream created again at the path starts from offset zero."""
        for sub_id in list(self.by_stream.get(path, ())):
            sub = self.subs[sub_id]
            link = sub.links[path]
            if link.explicit:
                link.glob = False
                link.acked = 0
            else:
                self._unlink(sub, path)
            self.dirty.add(sub_id)
            self.kick(sub_id)

    # ------------------------------------------------------------------ wakes

    def expire_lease(self, sub: Subscription, now: float) -> bool:
        """Clear a wake whose lease ran out (7.3); True when it did."""
        w = sub.wake
        if w is None or w.lease_until is None or now < w.lease_until:
            return False
        log.info("subscription %s: lease of generation %d expired", sub.id, w.generation)
        if self.metrics is not None:
            self.metrics.subscription_lease_expiries.inc()
        sub.wake = None
        return True

    def issue_wake(self, sub: Subscription, now: float) -> Wake | None:
        """A new wake generation for the pending streams, or None when nothing is pending."""
        pending = self.pending(sub)[:MAX_WAKE_STREAMS]
        if not pending:
            return None
        sub.generation += 1
        w = Wake(
            id=tokens.new_wake_id(),
            generation=sub.generation,
            snapshot={path: tail for path, _, tail in pending},
            issued_at=now,
        )
        if sub.type == WEBHOOK:
            w.next_attempt_at = now
        sub.wake = w
        if self.metrics is not None:
            self.metrics.subscription_wakes.labels(sub.type).inc()
        return w

    def observe_wake_latency(self, sub_id: str) -> None:
        started = self.pending_since.pop(sub_id, None)
        if started is not None and self.metrics is not None:
            self.metrics.subscription_wake_latency.observe(time.monotonic() - started)

    def token(self, sub: Subscription, purpose: str) -> str:
        assert sub.wake is not None
        return tokens.issue(
            sub.secret, tokens.TokenClaims(sub.id, purpose, sub.generation, sub.wake.id)
        )

    def check_wake(
        self, sub_id: str, token: str | None, body: object, purpose: str
    ) -> Subscription:
        """The subscription if ``token`` and the body's wake id and generation are current
        (7.3); 401 for a token this subscription did not issue, 409 FENCED for a stale one."""
        if not token:
            raise SubscriptionError("TOKEN_INVALID", "an Authorization: Bearer token is required")
        if not isinstance(body, dict):
            raise invalid("the body must be a JSON object")
        wake_id = body.get("wake_id")
        generation = body.get("generation")
        if (
            not isinstance(wake_id, str)
            or not isinstance(generation, int)
            or isinstance(generation, bool)
        ):
            raise invalid("wake_id (a string) and generation (an integer) are required")
        sub = self.subs.get(sub_id)
        if sub is None:
            if sub_id in self.tombstones:
                raise fenced(f"subscription {sub_id!r} was deleted")
            raise not_found(sub_id)
        claims = tokens.verify(sub.secret, token)
        if claims is None or claims.subscription != sub.id or claims.purpose != purpose:
            raise SubscriptionError("TOKEN_INVALID", "the token is not valid for this subscription")
        self.expire_lease(sub, self.clock())
        w = sub.wake
        if (
            w is None
            or claims.generation != sub.generation
            or generation != sub.generation
            or wake_id != w.id
            or claims.wake_id != w.id
        ):
            raise fenced(
                f"generation {generation} wake {wake_id[:40]!r} is not the current wake "
                f"(generation {sub.generation})"
            )
        return sub

    def parse_acks(self, sub: Subscription, body: dict[str, Any]) -> list[Ack]:
        """Every ack checked before any applies: all of them, or none."""
        raw = body.get("acks", [])
        if raw is None:
            raw = []
        if not isinstance(raw, list) or len(raw) > MAX_ACKS:
            raise invalid(f"acks must be an array of at most {MAX_ACKS} items")
        done = body.get("done", False)
        if done is not None and not isinstance(done, bool):
            raise invalid("done must be true or false")
        return [self._parse_ack(sub, item) for item in raw]

    def _parse_ack(self, sub: Subscription, item: object) -> Ack:
        if not isinstance(item, dict):
            raise invalid('each ack is {"stream": path, "offset": offset}')
        path = stream_path(
            item.get("stream", item.get("path")), "ack stream", max_bytes=self.max_path_bytes
        )
        offset = item.get("offset")
        if not isinstance(offset, str):
            raise invalid("ack offset must be a string")
        try:
            unit = parse_offset(offset, allow_now=False)
        except OffsetError as exc:
            raise invalid(f"ack offset: {exc}") from None
        if path not in sub.links:
            raise SubscriptionError(
                "INVALID_OFFSET", f"{path[:200]!r} is not a stream of this subscription"
            )
        if unit == START:
            raise SubscriptionError("INVALID_OFFSET", "an ack offset cannot be -1")
        if unit > self.tail(path):
            raise SubscriptionError(
                "INVALID_OFFSET", f"ack offset {offset} is past the tail of {path[:200]!r}"
            )
        return Ack(path, unit)

    def apply_acks(self, sub: Subscription, acks: Iterable[Ack]) -> None:
        """Move cursors forward; an ack below a cursor leaves it where it is."""
        for ack in acks:
            link = sub.links.get(ack.path)
            if link is not None and ack.unit > link.acked:
                link.acked = ack.unit

    def finish_wake(self, sub: Subscription) -> bool:
        """End the current wake; True when work is still pending (another wake follows)."""
        sub.wake = None
        more = self.has_pending(sub)
        self.kick(sub.id)
        return more

    async def callback(self, sub_id: str, token: str | None, body: object) -> dict[str, Any]:
        """A webhook receiver's ack (and heartbeat) for the current wake (7.1)."""
        sub = self.check_wake(sub_id, token, body, tokens.CALLBACK)
        if sub.type != WEBHOOK:
            raise invalid("this is a pull-wake subscription: use ack")
        assert isinstance(body, dict)
        return await self.acknowledge(sub, body)

    async def acknowledge(self, sub: Subscription, body: dict[str, Any]) -> dict[str, Any]:
        """Apply a checked wake's acks (webhook callback and pull-wake ack alike): with
        ``done`` the wake ends, without it the lease is extended (a heartbeat)."""
        acks = self.parse_acks(sub, body)
        self.apply_acks(sub, acks)
        more = False
        if body.get("done") is True:
            more = self.finish_wake(sub)
        else:
            assert sub.wake is not None
            sub.wake.lease_until = self.clock() + sub.config.lease_ttl_ms / 1000
            self.schedule(sub.id, sub.wake.lease_until)
        await self.save(sub)
        return {"ok": True, "next_wake": more}

    # ------------------------------------------------------------------ persistence

    async def save(self, sub: Subscription) -> None:
        self.dirty.discard(sub.id)
        if self.subs.get(sub.id) is sub:
            write = asyncio.ensure_future(self.saved.put(sub.id, sub.to_value()))
            self._writing[sub.id] = write
            try:
                await write
            finally:
                if self._writing.get(sub.id) is write:
                    del self._writing[sub.id]

    async def settled(self, sub_id: str) -> None:
        """Once the last write of ``sub_id`` begun is durable. A delivery's outcome
        changes the subscription in memory, then writes it; an answer that waits for
        this never shows a state a crash could still take back."""
        write = self._writing.get(sub_id)
        if write is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(write)

    # ------------------------------------------------------------------ links

    def _globbed(self, sub: Subscription, s: Stream) -> bool:
        c = sub.config
        return (
            c.pattern is not None
            and s.committed
            and not s.meta.soft_deleted
            and s.path != c.wake_stream
            and s.path.split("/", 1)[0] != "__ds"
            and c.pattern.matches(s.path)
        )

    def _link(
        self,
        sub: Subscription,
        path: str,
        acked: int,
        *,
        explicit: bool = False,
        glob: bool = False,
    ) -> bool:
        changed = sub.link(path, acked, explicit=explicit, glob=glob)
        self.by_stream.setdefault(path, set()).add(sub.id)
        return changed

    def _unlink(self, sub: Subscription, path: str) -> None:
        sub.links.pop(path, None)
        ids = self.by_stream.get(path)
        if ids is not None:
            ids.discard(sub.id)
            if not ids:
                del self.by_stream[path]

    def _forget(self, sub: Subscription) -> None:
        for path in list(sub.links):
            self._unlink(sub, path)
        self.subs.pop(sub.id, None)
        self.dirty.discard(sub.id)
        self.pending_since.pop(sub.id, None)

    def _count(self) -> None:
        if self.metrics is not None:
            for kind in (WEBHOOK, PULL_WAKE):
                self.metrics.subscriptions.labels(kind).set(
                    sum(1 for s in self.subs.values() if s.type == kind)
                )


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{int(ts * 1000) % 1000:03d}Z"
    )
