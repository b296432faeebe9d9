"""The store a node serves, built once for whichever topology asks (``StoreFactory``),
and the store's events fanned out to the Parts that listen (``Listeners``).

The topology decides the engine's replica hooks and the pipeline's ack gate (a
replica set's, a follower's read-only hooks, none); the Parts built before the store
add their own (the archive's floor and gate). The store is built before the Parts
that need it exist: ``Listeners`` is its events object, filled in once they all are
(the store looks each event up when it happens).

The events run inside the commit pipeline's completion, where an exception would
strand every request of the batch: a Part whose listener may fail catches it itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from typing import Any

from stream_server.config import Settings
from stream_server.engine import Engine
from stream_server.engine.replica import AckGate, ReplicaHooks
from stream_server.faults import hook_from_env
from stream_server.node.part import Part
from stream_server.streams.retention import parse_policies
from stream_server.streams.store import StreamStore
from stream_server.streams.store_options import StoreEvents, StoreLimits

EVENTS = [f.name for f in fields(StoreEvents)]


class Listeners:
    """The store's ``StoreEvents``: one object, given to the store before the Parts are
    known and filled in by ``bind`` once they are. An event no Part listens to stays
    None (the store then does nothing for it) and one that a single Part hears calls
    that Part's hook straight: the append path pays for no fan-out it does not need."""

    def __init__(self) -> None:
        self._events = StoreEvents()

    def bind(self, parts: Iterable[Part]) -> None:
        events = [e for part in parts if (e := part.listener()) is not None]
        for name in EVENTS:
            hooks = tuple(h for e in events if (h := getattr(e, name)) is not None)
            setattr(self._events, name, _one_call(hooks))

    def events(self) -> StoreEvents:
        return self._events


def _one_call(hooks: tuple[Callable[..., None], ...]) -> Callable[..., None] | None:
    """None for no hook, the hook itself for one, else a call of each in order."""
    if len(hooks) <= 1:
        return hooks[0] if hooks else None

    def call(*args: Any) -> None:
        for hook in hooks:
            hook(*args)

    return call


class StoreFactory:
    """Builds the store on its engine; a topology passes its ``replica`` hooks and its
    ``gate`` (``replication.replica_set.StoreFactory``)."""

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
            limits=StoreLimits(retention=parse_policies(s.retention)),
            settings=s,
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
