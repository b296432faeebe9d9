"""The archive (docs/backup.md) as a Part: built from the settings, started once recovery
has finished, switched with the replica's role, stopped at shutdown.

It shapes the store: the WAL not yet uploaded is kept (the engine's archive floor),
and in required mode a batch is acknowledged once archived (the ack gate, after a
replica set's). A single node archives under term 0 (history ``[[0, 1]]``). On a
replica set's member only the primary archives (its ``primary_work``), and a standby
polls the archive's end to delete the spooled WAL it holds. The pending bound is
checked where the app admits a write (``write_refusal``), before the body is read: a
refused write costs nothing, and the check is one attribute when the archive is
within its bound. ``/_archive/status`` answers on every server: the archive's state,
a follower's (``FollowerPart``), or that there is none (``ArchiveOff``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client.registry import Collector
from starlette.routing import BaseRoute

from stream_format.archive import SINGLE_NODE_HISTORY, History
from stream_format.layout import Layout
from stream_server.archive.archive_metrics import ArchiveCollector
from stream_server.archive.follow_position import single_node_term
from stream_server.archive.object_store import ObjectStore
from stream_server.archive.progress import OFF_DOCUMENT
from stream_server.archive.upload.ack_gate import ArchiveGate, BothGates
from stream_server.archive.upload.archive_end import with_term
from stream_server.archive.upload.archiver import Archiver
from stream_server.engine.replica import AckGate
from stream_server.node.admin import status_route
from stream_server.node.part import Part
from stream_server.node.service_part import Node, ServicePart
from stream_server.protocol.refusal import Refusal
from stream_server.replication.primary_work import PrimaryWork
from stream_server.streams.store_options import StoreEvents

DRAIN_SECONDS = 5.0  # a clean shutdown waits this long for the last upload
RETRY_AFTER = 5  # seconds a write refused at the pending bound is told to wait


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
        super().__init__(node)
        s = node.settings
        self.terms: Callable[[], History] = lambda: SINGLE_NODE_HISTORY
        self.base: Callable[[], int] = lambda: 0  # the last lsn not archived here
        self.archiver = Archiver(
            Layout(s.data_dir),
            ObjectStore(s),
            s,
            published=lambda: node.store.engine.published_lsn,
            history=lambda: self.terms() or SINGLE_NODE_HISTORY,
            base=lambda: self.base(),
        )
        self.archive_floor = self.archiver.floor
        self.backup_taken = self.archiver.backup_taken
        self.progress = self.archiver.progress
        self.gate = ArchiveGate(self.progress) if s.archive_mode == "required" else None
        if self.gate is not None:
            self.archiver.on_progress = self.gate.progressed

    def ack_gate(self, inner: AckGate | None) -> AckGate | None:
        """The set's gate (or none), then the archive's in required mode."""
        if self.gate is None:
            return inner
        return self.gate if inner is None else BothGates(inner, self.gate)

    def bind(self) -> None:
        """Where the term history comes from: a replica set's hooks, with a new primary's
        term in it from the start (``archive_end.with_term``); a single node's term 0,
        or after a promotion the term above its source's (``follow_position``), whose
        archive begins at that term's first lsn: the frames before it are in the archive
        it followed, no gap in this one."""
        engine, hooks = self.node.store.engine, self.node.topology.term_hooks
        if hooks is not None:
            self.terms = lambda: with_term(
                hooks.terms, hooks.term if hooks.writable else None, engine.lsn
            )
        else:
            self.terms = lambda: single_node_term(engine)[1]
            self.base = lambda: single_node_term(engine)[1][-1][1] - 1

    def listener(self) -> StoreEvents:
        notify = self.archiver.notify
        return StoreEvents(on_batch=lambda _stats, _requests: notify())

    def collectors(self) -> list[Collector]:
        return [ArchiveCollector(self.progress, self.node.settings.archive_timeout)]

    def routes(self) -> list[BaseRoute]:
        return [status_route(self.progress.document, self.node.topology.peer_allowed)]

    def write_refusal(self) -> Refusal | None:
        """The 503 for a new write while the archive is behind its pending bound."""
        if not self.archiver.behind():
            return None
        p = self.progress
        body = (
            f"archive behind: {p.pending_bytes} bytes of WAL wait for the archive "
            f"(bound {self.archiver.settings.archive_max_pending_bytes}); "
            f"last error: {p.last_error or 'none'}\n"
        )
        return Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], body.encode())

    async def start(self) -> None:
        """Once recovered: a single node archives; a replica starts as a standby unless
        the role switch has made it the primary already."""
        if self.node.kind.primary_only:
            await self._start("standby", unless_started=True)
        else:
            await self._start("archiving")

    async def _start(self, role: str, *, unless_started: bool = False) -> None:
        if self.gate is not None:
            self.gate.bind(asyncio.get_running_loop())
        await asyncio.to_thread(self.archiver.start, role, unless_started=unless_started)

    def primary_work(self) -> PrimaryWork:
        return PrimaryWork("archive", self._archiving, self._standby)

    async def _archiving(self) -> None:
        await self._start("archiving")

    async def _standby(self) -> None:
        await self._start("standby")

    async def stop(self) -> None:
        """At shutdown: what is published is uploaded first, for up to DRAIN_SECONDS."""
        await asyncio.to_thread(self.archiver.drain, DRAIN_SECONDS)


class ArchiveOff(Part):
    """No archive configured: its status says so."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def routes(self) -> list[BaseRoute]:
        return [status_route(lambda: OFF_DOCUMENT, self.node.topology.peer_allowed)]
