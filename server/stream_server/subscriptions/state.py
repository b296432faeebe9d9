"""One subscription's whole state, and the keyed value that saves it.

A subscription is its configuration (``spec.py``), its links (one cursor,
``acked``, per linked stream, in offset units), and at most one wake: the
current generation's wake id, the tails it was issued for (what a webhook's
``{"done": true}`` acknowledges), the pull-wake lease holder and lease
deadline, and the webhook retry schedule. The whole of it is one JSON value
under the subscription's id, rewritten on every change: small, atomic, and
read back unchanged after a crash. A deleted subscription leaves a tombstone
with its last generation, so that a request carrying a token of the deleted
one is fenced, and a subscription re-created under the same id continues
the generation count instead of reusing numbers.

Times that must survive a restart (lease and retry deadlines) are wall-clock
seconds; nothing here reads a clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stream_server.subscriptions.spec import WEBHOOK, SubscriptionConfig

VALUE_VERSION = 1
ACTIVE = "active"
FAILED = "failed"


@dataclass(slots=True)
class Link:
    path: str
    acked: int  # last processed unit (the cursor): data past it is pending
    explicit: bool = False
    glob: bool = False

    @property
    def link_type(self) -> str:
        return "explicit" if self.explicit else "glob"


@dataclass(slots=True)
class Wake:
    id: str
    generation: int
    snapshot: dict[str, int]  # path -> tail when the wake was issued
    issued_at: float
    holder: str | None = None  # the pull-wake worker holding the lease
    lease_until: float | None = None  # wall-clock deadline of the lease
    delivered: bool = False  # a webhook receiver accepted it (2xx)
    attempt: int = 0  # failed webhook deliveries of this wake so far
    next_attempt_at: float | None = None  # when the next webhook delivery is due


@dataclass(slots=True)
class Subscription:
    id: str
    config: SubscriptionConfig
    config_hash: str
    created_at: float
    secret: str  # HMAC key of this subscription's tokens (tokens.py)
    origin: str = ""  # scheme://host of the server as its creator reached it (callback URLs)
    links: dict[str, Link] = field(default_factory=dict)
    generation: int = 0
    wake: Wake | None = None

    @property
    def type(self) -> str:
        return self.config.type

    @property
    def status(self) -> str:
        """``failed`` while a webhook retry is scheduled after a failed delivery (6.3)."""
        w = self.wake
        if self.type == WEBHOOK and w is not None and not w.delivered and w.attempt > 0:
            return FAILED
        return ACTIVE

    def link(self, path: str, acked: int, *, explicit: bool = False, glob: bool = False) -> bool:
        """Link ``path`` (at ``acked`` when new); True when anything changed."""
        cur = self.links.get(path)
        if cur is None:
            self.links[path] = Link(path, acked, explicit=explicit, glob=glob)
            return True
        changed = (explicit and not cur.explicit) or (glob and not cur.glob)
        cur.explicit = cur.explicit or explicit
        cur.glob = cur.glob or glob
        return changed

    def to_value(self) -> bytes:
        w = self.wake
        return json.dumps(
            {
                "v": VALUE_VERSION,
                "id": self.id,
                "config": self.config.canonical(),
                "config_hash": self.config_hash,
                "created_at": self.created_at,
                "secret": self.secret,
                "origin": self.origin,
                "generation": self.generation,
                "links": [[k.path, k.acked, k.explicit, k.glob] for k in self.links.values()],
                "wake": None
                if w is None
                else {
                    "id": w.id,
                    "generation": w.generation,
                    "snapshot": w.snapshot,
                    "issued_at": w.issued_at,
                    "holder": w.holder,
                    "lease_until": w.lease_until,
                    "delivered": w.delivered,
                    "attempt": w.attempt,
                    "next_attempt_at": w.next_attempt_at,
                },
            },
            separators=(",", ":"),
        ).encode()


@dataclass(frozen=True, slots=True)
class Tombstone:
    id: str
    generation: int
    deleted_at: float

    def to_value(self) -> bytes:
        return json.dumps(
            {
                "v": VALUE_VERSION,
                "id": self.id,
                "deleted": True,
                "generation": self.generation,
                "deleted_at": self.deleted_at,
            },
            separators=(",", ":"),
        ).encode()


class UnreadableValue(ValueError):
    pass


def from_value(raw: bytes, *, max_path_bytes: int) -> Subscription | Tombstone:
    try:
        d: dict[str, Any] = json.loads(raw)
        if d.get("v") != VALUE_VERSION:
            raise UnreadableValue(f"unknown subscription value version {d.get('v')!r}")
        if d.get("deleted"):
            return Tombstone(str(d["id"]), int(d["generation"]), float(d["deleted_at"]))
        config = SubscriptionConfig.from_canonical(d["config"], max_path_bytes=max_path_bytes)
        sub = Subscription(
            id=str(d["id"]),
            config=config,
            config_hash=str(d["config_hash"]),
            created_at=float(d["created_at"]),
            secret=str(d["secret"]),
            origin=str(d.get("origin", "")),
            generation=int(d["generation"]),
        )
        for path, acked, explicit, glob in d["links"]:
            sub.links[str(path)] = Link(str(path), int(acked), bool(explicit), bool(glob))
        w = d.get("wake")
        if w is not None:
            sub.wake = Wake(
                id=str(w["id"]),
                generation=int(w["generation"]),
                snapshot={str(k): int(v) for k, v in w["snapshot"].items()},
                issued_at=float(w["issued_at"]),
                holder=w.get("holder"),
                lease_until=w.get("lease_until"),
                delivered=bool(w.get("delivered")),
                attempt=int(w.get("attempt", 0)),
                next_attempt_at=w.get("next_attempt_at"),
            )
        return sub
    except UnreadableValue:
        raise
    except Exception as exc:  # a value we cannot read: say which and why
        raise UnreadableValue(f"unreadable subscription value: {exc!r}") from None
