"""The store a node serves, built once for whichever topology asks (``StoreFactory``),
and the store's events fanned out to the Parts that listen (``Listeners``).

The topology decides the engine's replica hooks and the pipeline's ack gate (a
replica set's, a follower's read-only hooks, none); the Parts built before the store
add their own (the archive's floor and gate). The pipeline takes its batch hook
when it is built, before the Parts that need the store exist: ``Listeners`` is
that hook, and is told its Parts once they all are.

The events run inside the commit pipeline's completion, where an exception would
strand every request of the batch: a Part whose listener may fail catches it itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from stream_server.config import Settings
from stream_server.engine import Engine, StorageError
from stream_server.engine.batch import BatchStats
from stream_server.engine.replica import AckGate, ReplicaHooks
from stream_server.faults import hook_from_env
from stream_server.node.part import Part
from stream_server.streams.model import Stream
from stream_server.streams.options import StoreEvents, StoreLimits
from stream_server.streams.retention import parse_policies
from stream_server.streams.store import StreamStore


class Listeners:
    """The store's ``StoreEvents``, each calling the Parts' hooks in their order."""

    def __init__(self) -> None:
        self._batch: tuple[Callable[[BatchStats, int], None], ...] = ()
        self._created: tuple[Callable[[Stream], None], ...] = ()
        self._appended: tuple[Callable[[Stream], None], ...] = ()
        self._deleted: tuple[Callable[[str, str], None], ...] = ()
        self._producer: tuple[Callable[[str], None], ...] = ()
        self._failure: tuple[Callable[[StorageError], None], ...] = ()

    def bind(self, parts: Iterable[Part]) -> None:
        events = [e for part in parts if (e := part.listener()) is not None]

        def hooks(name: str) -> tuple[Any, ...]:
            return tuple(h for e in events if (h := getattr(e, name)) is not None)

        self._batch = hooks("on_batch")
        self._created = hooks("on_created")
        self._appended = hooks("on_appended")
        self._deleted = hooks("on_deleted")
        self._producer = hooks("on_producer")
        self._failure = hooks("on_failure")

    def events(self) -> StoreEvents:
        return StoreEvents(
            on_batch=self.on_batch,
            on_created=self.on_created,
            on_appended=self.on_appended,
            on_deleted=self.on_deleted,
            on_producer=self.on_producer,
            on_failure=self.on_failure,
        )

    def on_batch(self, stats: BatchStats, requests: int) -> None:
        for hook in self._batch:
            hook(stats, requests)

    def on_created(self, stream: Stream) -> None:
        for hook in self._created:
            hook(stream)

    def on_appended(self, stream: Stream) -> None:
        for hook in self._appended:
            hook(stream)

    def on_deleted(self, path: str, reason: str) -> None:
        for hook in self._deleted:
            hook(path, reason)

    def on_producer(self, event: str) -> None:
        for hook in self._producer:
            hook(event)

    def on_failure(self, error: StorageError) -> None:
        for hook in self._failure:
            hook(error)


class StoreFactory:
    """Builds the store on its engine; a topology passes its ``replica`` hooks and its
    ``gate`` (``replication.service.StoreFactory``)."""

    def __init__(self, settings: Settings, events: StoreEvents, parts: Sequence[Part]) -> None:
        self.settings = settings
        self.events = events
        self.parts = parts  # those built before the store: they shape it

    def __call__(
        self, replica: ReplicaHooks | None = None, gate: AckGate | None = None
    ) -> StreamStore:
        s = self.settings
        floors = [p.archive_floor for p in self.parts if p.archive_floor is not None]
        for part in self.parts:
            gate = part.ack_gate(gate)
        return StreamStore(
            s.data_dir,
            limits=StoreLimits(
                default_ttl=s.default_ttl or None,
                max_streams=s.max_streams or None,
                hot_streams=s.hot_streams,
                max_producers_per_stream=s.max_producers_per_stream,
                max_fork_depth=s.max_fork_depth,
                max_json_messages=s.max_json_messages,
                retention=parse_policies(s.retention),
            ),
            events=self.events,
            engine=Engine(
                s.data_dir,
                map_size=s.lmdb_map_size,
                checkpoint_frames=s.checkpoint_frames,
                checkpoint_seconds=s.checkpoint_interval,
                fault_hook=hook_from_env(os.environ.get("DS_FAULT")),
                replica=replica,
                archive_floor=floors[0] if floors else None,
            ),
            gate=gate,
        )
