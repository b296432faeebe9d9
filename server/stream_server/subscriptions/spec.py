"""A subscription's configuration: parsed, checked and normalised from a PUT body.

Section 6.2 makes re-confirmation idempotent by a hash of the *normalised*
configuration, so two spellings of the same subscription (``/events/*/``
and ``events/*``, streams in another order or repeated) must normalise to
the same value and the same hash; everything that is not configuration
(links, cursors, wakes) stays out of it. Unknown fields are ignored, so a
client written against a later protocol revision still gets its
subscription, but every known field is checked for type and range: a
malformed body is a 400 that changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from stream_server.streams.path_rules import MAX_PATH_BYTES, path_problem
from stream_server.subscriptions.glob import Pattern, PatternError
from stream_server.subscriptions.subscription_errors import invalid

WEBHOOK = "webhook"
PULL_WAKE = "pull-wake"
TYPES = (WEBHOOK, PULL_WAKE)

DEFAULT_LEASE_TTL_MS = 30_000
MIN_LEASE_TTL_MS = 1_000
MAX_LEASE_TTL_MS = 600_000
MAX_STREAMS_PER_REQUEST = 1000
MAX_DESCRIPTION_CHARS = 1024
MAX_URL_BYTES = 2048
MAX_ID_CHARS = 128
RESERVED = "__ds"
ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:~")


@dataclass(frozen=True, slots=True)
class SubscriptionConfig:
    type: str
    pattern: Pattern | None
    streams: tuple[str, ...]  # sorted, unique
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None

    def canonical(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "pattern": self.pattern.text if self.pattern else None,
            "streams": list(self.streams),
            "webhook": {"url": self.webhook_url} if self.webhook_url is not None else None,
            "wake_stream": self.wake_stream,
            "lease_ttl_ms": self.lease_ttl_ms,
            "description": self.description,
        }

    def hash(self) -> str:
        raw = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(raw.encode()).hexdigest()

    def covered_paths(self) -> list[str]:
        """Every stream path (or pattern root) the subscription reads or writes, for auth."""
        out = list(self.streams)
        if self.pattern is not None:
            out.append(self.pattern.literal_prefix)
        if self.wake_stream is not None:
            out.append(self.wake_stream)
        return out

    @classmethod
    def from_canonical(cls, d: dict[str, Any], *, max_path_bytes: int) -> SubscriptionConfig:
        return parse_config(
            {k: v for k, v in d.items() if v is not None},
            max_path_bytes=max_path_bytes,
            stored=True,
        )


def check_id(sub_id: str) -> str:
    if not sub_id or len(sub_id) > MAX_ID_CHARS or not set(sub_id) <= ID_CHARS:
        raise invalid(
            f"a subscription id is 1 to {MAX_ID_CHARS} characters of letters, digits and - _ . : ~"
        )
    return sub_id


def check_new_id(sub_id: str) -> str:
    """An id a new subscription may take: ``check_id``'s, less ``.`` and ``..``, which
    clients and proxies resolve away as URL path segments, so that nothing could
    reach the subscription's callback URL (``.../ID/callback``). Only a PUT
    refuses them: one made before this check can still be read and deleted."""
    if check_id(sub_id) in (".", ".."):
        raise invalid("a subscription id may not be '.' or '..': it could never be reached")
    return sub_id


def stream_path(value: object, what: str, *, max_bytes: int, stored: bool = False) -> str:
    """A stream-root-relative path from a request body, normalised (no outer slashes),
    checked by the rule stream requests are (``streams.path_rules``): a link to a path
    no stream can have would never be woken. ``max_bytes`` (``--max-path-bytes``)
    caps it below that rule's own total, never above. A ``stored`` configuration
    (read back from its saved value) is held to the rule it was accepted under, so that a
    subscription made before the rule was shared is still served."""
    if not isinstance(value, str):
        raise invalid(f"{what} must be a string")
    path = value.strip("/")
    if not path:
        raise invalid(f"{what} is empty")
    if stored:
        problem = path_problem(path, max_bytes=max_bytes, max_segment=max_bytes)
    else:
        problem = path_problem(path, max_bytes=min(max_bytes, MAX_PATH_BYTES))
    if problem is not None:
        raise invalid(f"{what}: {problem}")
    if path.split("/", 1)[0] == RESERVED:
        raise invalid(f"{what}: paths under {RESERVED}/ are reserved")
    return path


def stream_list(value: object, *, max_bytes: int, stored: bool = False) -> list[str]:
    if not isinstance(value, list):
        raise invalid("streams must be an array of stream paths")
    if len(value) > MAX_STREAMS_PER_REQUEST:
        raise invalid(f"at most {MAX_STREAMS_PER_REQUEST} streams per request")
    return [stream_path(v, "each of streams", max_bytes=max_bytes, stored=stored) for v in value]


def parse_config(body: object, *, max_path_bytes: int, stored: bool = False) -> SubscriptionConfig:
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    kind = body.get("type")
    if kind not in TYPES:
        raise invalid('type must be "webhook" or "pull-wake"')
    pattern = _pattern(body.get("pattern"), max_path_bytes)
    raw_streams = body.get("streams")
    streams: tuple[str, ...] = ()
    if raw_streams is not None:
        streams = tuple(
            sorted(set(stream_list(raw_streams, max_bytes=max_path_bytes, stored=stored)))
        )
    if pattern is None and not streams:
        raise invalid("at least one of pattern or streams is required")
    webhook_url = _webhook_url(kind, body.get("webhook"))
    wake_stream = _wake_stream(kind, body.get("wake_stream"), max_path_bytes, stored)
    if wake_stream is not None and wake_stream in streams:
        raise invalid("the wake stream cannot also be one of the subscription's streams")
    return SubscriptionConfig(
        type=kind,
        pattern=pattern,
        streams=streams,
        webhook_url=webhook_url,
        wake_stream=wake_stream,
        lease_ttl_ms=_lease_ttl_ms(body.get("lease_ttl_ms")),
        description=_description(body.get("description")),
    )


def _pattern(raw: object, max_path_bytes: int) -> Pattern | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise invalid("pattern must be a string")
    try:
        pattern = Pattern.parse(raw, max_bytes=max_path_bytes)
    except PatternError as exc:
        raise invalid(f"pattern: {exc}") from None
    if pattern.segments[0] == RESERVED:
        raise invalid(f"pattern: paths under {RESERVED}/ are reserved")
    return pattern


def _webhook_url(kind: str, raw: object) -> str | None:
    if kind != WEBHOOK:
        if raw is not None:
            raise invalid("webhook is only for webhook subscriptions")
        return None
    if not isinstance(raw, dict):
        raise invalid("a webhook subscription needs webhook.url")
    url = raw.get("url")
    if not isinstance(url, str) or not url:
        raise invalid("a webhook subscription needs webhook.url, a string")
    if len(url.encode()) > MAX_URL_BYTES:
        raise invalid(f"webhook.url longer than {MAX_URL_BYTES} bytes")
    return url


def _wake_stream(kind: str, raw: object, max_path_bytes: int, stored: bool) -> str | None:
    if kind != PULL_WAKE:
        if raw is not None:
            raise invalid("wake_stream is only for pull-wake subscriptions")
        return None
    if raw is None:
        raise invalid("a pull-wake subscription needs wake_stream")
    return stream_path(raw, "wake_stream", max_bytes=max_path_bytes, stored=stored)


def _lease_ttl_ms(lease: object) -> int:
    if lease is None:
        return DEFAULT_LEASE_TTL_MS
    if isinstance(lease, float) and lease.is_integer():
        lease = int(lease)
    if (
        not isinstance(lease, int)
        or isinstance(lease, bool)
        or not MIN_LEASE_TTL_MS <= lease <= MAX_LEASE_TTL_MS
    ):
        raise invalid(
            f"lease_ttl_ms must be an integer from {MIN_LEASE_TTL_MS} to {MAX_LEASE_TTL_MS}"
        )
    return lease


def _description(description: object) -> str | None:
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS
    ):
        raise invalid(f"description must be a string of at most {MAX_DESCRIPTION_CHARS} chars")
    return description
