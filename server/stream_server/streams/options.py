"""How a store is set up: its limits, and the hooks through which metrics watch it."""

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
    read_threads: int = 4
    default_ttl: int | None = None
    sweep_interval: float = 1.0
    max_streams: int | None = None
    # Loaded streams kept in memory; past it the least recently used idle ones are
    # dropped and loaded again from LMDB when next asked for (``pending.StreamTable``).
    hot_streams: int = 4096
    max_producers_per_stream: int = 1000
    max_fork_depth: int = 64
    max_json_messages: int = 100_000
    retention: tuple[Policy, ...] = ()  # by path prefix (streams/retention.py)
