"""How a store is set up, beside its settings: its threads, sweeps and retention, and
the hooks through which metrics watch it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stream_server.engine import BatchStats, StorageError
from stream_server.streams.model import Stream
from stream_server.streams.retention import Policy


@dataclass(slots=True)
class StoreEvents:
    """Hooks for metrics and subscriptions; each is optional and called on the loop."""

    on_batch: Callable[[BatchStats, int], None] | None = None
    on_created: Callable[[Stream], None] | None = None
    # Data appended to an existing stream, once durable (subscriptions wake on it).
    on_appended: Callable[[Stream], None] | None = None
    on_deleted: Callable[[str, str], None] | None = None  # path, "deleted" | "expired"
    on_failure: Callable[[StorageError], None] | None = None
    on_producer: Callable[[str], None] | None = None  # "duplicate" | "fenced" | "gap"


@dataclass
class StoreLimits:
    """What a store is told beside its group of settings (``LimitsSettings``): none is
    a setting itself (the retention rules are, parsed here)."""

    read_threads: int = 4
    sweep_interval: float = 1.0
    retention: tuple[Policy, ...] = ()  # by path prefix (streams/retention.py)
