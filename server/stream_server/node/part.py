"""The shape every service of a node has (``Part``), so the app wires them all alike.

Every hook has a default that does nothing: a Part overrides what it has. The app
asks each Part in its list order, which is the order of the store's listeners,
of the starts and of the primary-only work; stops run in the reverse order, so a
Part stops before the ones it was started after.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.registry import Collector
from starlette.routing import BaseRoute

from stream_server.engine.replica import AckGate
from stream_server.protocol.refusal import Refusal
from stream_server.replication.primary_work import PrimaryWork
from stream_server.streams.store_options import StoreEvents

# An ASGI callable, for the paths a Part answers ahead of Starlette.
Asgi = Callable[[Any, Any, Any], Awaitable[None]]


class Part:
    """One service of a node: what it serves, counts, refuses, listens to and runs."""

    # A write is asked ``write_refusal`` only when some Part (or the topology) may
    # refuse it: a node without one takes no step of its own on a write.
    refuses_writes = False
    # The engine's archive floor (WAL not yet archived is kept); one Part at most.
    archive_floor: Callable[[], int] | None = None

    def routes(self) -> list[BaseRoute]:
        """Starlette routes outside the streams' base path."""
        return []

    def ahead(self) -> dict[str, Asgi]:
        """Paths answered before Starlette, for requests that every write waits on."""
        return {}

    def collectors(self) -> list[Collector]:
        """Its ``/metrics`` series, registered when metrics are on."""
        return []

    def listener(self) -> StoreEvents | None:
        """What it is told of the store's events (``StoreEvents``): batches, streams
        created, appended and deleted, producer events, storage failures."""
        return None

    def bind(self) -> None:
        """Once the topology has built the store (for a Part built before it)."""

    def ack_gate(self, inner: AckGate | None) -> AckGate | None:
        """The pipeline's ack gate with this Part's own condition added, if any."""
        return inner

    def write_refusal(self) -> Refusal | None:
        """Its refusal of a new write now (asked when ``refuses_writes``)."""
        return None

    def not_started(self) -> str | None:
        """Why it is not ready while the store is (a ``/readyz`` problem)."""
        return None

    def unready(self) -> str | None:
        """A ``/readyz`` problem of its own, whatever the store's state."""
        return None

    def primary_work(self) -> PrimaryWork | None:
        """Work that writes of its own accord: on a replica set's member it runs only
        while this replica is primary (``Topology.start``)."""
        return None

    async def start(self) -> None:
        """Once the store has recovered."""

    async def stop(self) -> None:
        """At shutdown, before the store closes."""
