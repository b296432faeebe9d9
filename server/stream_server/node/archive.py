"""The archive (docs/backup.md) as a Part: it shapes the store (the WAL it has not
uploaded is kept, and in required mode a batch is acknowledged once archived), wakes
on each batch, refuses writes past its pending bound, and on a replica set's member
archives only while primary. ``/_archive/status`` answers on every server: the
archive's state, a follower's (``FollowerPart``), or that there is none (``ArchiveOff``).
"""

from __future__ import annotations

from prometheus_client.registry import Collector
from starlette.routing import BaseRoute

from stream_server.archive.progress import OFF_DOCUMENT
from stream_server.archive.service import ArchiveService
from stream_server.engine.replica import AckGate
from stream_server.node.admin import status_route
from stream_server.node.context import Node, ServicePart
from stream_server.node.part import Part
from stream_server.replication.service import PrimaryWork
from stream_server.replication.write_fence import Refusal
from stream_server.streams.options import StoreEvents


class ArchivePart(ServicePart):
    shapes_store = True
    refuses_writes = True

    @classmethod
    def build(cls, node: Node) -> Part | None:
        if not node.kind.archives:
            return None  # its status is the follower's
        if not node.settings.archive_url:
            return ArchiveOff(node)
        return cls(node)

    def __init__(self, node: Node) -> None:
        self.node = node
        self.service = ArchiveService(node.settings, lambda: node.store.engine.published_lsn)
        self.archive_floor = self.service.archiver.floor
        self.backup_taken = self.service.archiver.backup_taken
        self._terms_bound = False

    def ack_gate(self, inner: AckGate | None) -> AckGate | None:
        return self.service.store_gate(inner)

    def listener(self) -> StoreEvents:
        notify = self.service.archiver.notify
        return StoreEvents(on_batch=lambda _stats, _requests: notify())

    def collectors(self) -> list[Collector]:
        return [self.service.collector]

    def routes(self) -> list[BaseRoute]:
        return [status_route(self.service.status, self.node.topology.peer_allowed)]

    def write_refusal(self) -> Refusal | None:
        return self.service.refusal()

    def bind(self) -> None:
        """Once the topology has built the store: where the term history comes from."""
        self.service.bind_terms(self.node.store.engine, self.node.topology.term_hooks)

    async def start(self) -> None:
        await self.service.begin(replicated=self.node.kind.primary_only)

    def primary_work(self) -> PrimaryWork:
        return PrimaryWork("archive", self.service.primary, self.service.standby)

    async def stop(self) -> None:
        await self.service.stop()


class ArchiveOff(Part):
    """No archive configured: its status says so."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def routes(self) -> list[BaseRoute]:
        return [status_route(lambda: OFF_DOCUMENT, self.node.topology.peer_allowed)]
