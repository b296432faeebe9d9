"""The archive as the app sees it: built from the settings, started once recovery
has finished, switched with the replica's role, stopped at shutdown.

A single node archives under term 0 (history ``[[0, 1]]``). In a replica set only
the primary archives: the role switch starts and stops it as primary work
(replication/role_switch.py ``PrimaryWork``), and a standby polls the archive's
end to delete the spooled WAL it holds. The pending bound is checked where the
app admits a write (``refusal``), before the body is read: a refused write costs
nothing, and the check is one attribute when the archive is within its bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from stream_format.archive import SINGLE_NODE_HISTORY, History
from stream_format.layout import Layout
from stream_server.archive.ack_gate import ArchiveGate, BothGates
from stream_server.archive.archive_end import with_term
from stream_server.archive.archiver import Archiver
from stream_server.archive.archiver_settings import ArchiverSettings
from stream_server.archive.collector import ArchiveCollector
from stream_server.archive.follow_position import single_node_term
from stream_server.archive.object_store import ObjectStore
from stream_server.config import Settings
from stream_server.engine.batch import BatchStats
from stream_server.engine.engine import Engine
from stream_server.engine.replica import AckGate, ReplicaHooks
from stream_server.replication.write_fence import Refusal

DRAIN_SECONDS = 5.0  # a clean shutdown waits this long for the last upload
RETRY_AFTER = 5  # seconds a write refused at the pending bound is told to wait


class ArchiveService:
    def __init__(self, settings: Settings, published: Callable[[], int]) -> None:
        self.terms: Callable[[], History] = lambda: SINGLE_NODE_HISTORY
        self.base: Callable[[], int] = lambda: 0  # the last lsn not archived here
        self.archiver = Archiver(
            Layout(settings.data_dir),
            ObjectStore.of(settings),
            ArchiverSettings(
                timeout=settings.archive_timeout,
                object_bytes=settings.archive_object_bytes,
                max_pending_bytes=settings.archive_max_pending_bytes,
                required=settings.archive_mode == "required",
            ),
            published=published,
            history=lambda: self.terms() or SINGLE_NODE_HISTORY,
            base=lambda: self.base(),
        )
        self.progress = self.archiver.progress
        self.gate = ArchiveGate(self.progress) if settings.archive_mode == "required" else None
        if self.gate is not None:
            self.archiver.on_progress = self.gate.progressed
        self.collector = ArchiveCollector(self.progress, settings.archive_timeout)

    def store_gate(self, gate: AckGate | None) -> AckGate | None:
        """The pipeline's ack gate: the set's (or none), then the archive's in required mode."""
        if self.gate is None:
            return gate
        return self.gate if gate is None else BothGates(gate, self.gate)

    def refusal(self) -> Refusal | None:
        """The 503 for a new write while the archive is behind its pending bound."""
        if not self.archiver.behind():
            return None
        p = self.progress
        body = (
            f"archive behind: {p.pending_bytes} bytes of WAL wait for the archive "
            f"(bound {self.archiver.settings.max_pending_bytes}); "
            f"last error: {p.last_error or 'none'}\n"
        )
        return Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], body.encode())

    def bind_terms(self, engine: Engine, hooks: ReplicaHooks | None) -> None:
        """Where the term history comes from: a replica set's hooks, with a new primary's
        term in it from the start (``archive_end.with_term``); a single node's term 0,
        or after a promotion the term above its source's (``follow_position``), whose
        archive begins at that term's first lsn: the frames before it are in the archive
        it followed, no gap in this one."""
        if hooks is not None:
            self.terms = lambda: with_term(
                hooks.terms, hooks.term if hooks.writable else None, engine.lsn
            )
        else:
            self.terms = lambda: single_node_term(engine)[1]
            self.base = lambda: single_node_term(engine)[1][-1][1] - 1

    def on_batch(
        self, inner: Callable[[BatchStats, int], None] | None
    ) -> Callable[[BatchStats, int], None]:
        """The store's batch hook: ``inner`` (the metrics'), then the archiver woken."""
        notify = self.archiver.notify
        if inner is None:
            return lambda _stats, _count: notify()

        def both(stats: BatchStats, count: int) -> None:
            inner(stats, count)
            notify()

        return both

    async def begin(self, *, replicated: bool) -> None:
        """Once recovered: a single node archives; a replica starts as a standby unless
        the role switch has made it the primary already."""
        if replicated:
            await self.start("standby", unless_started=True)
        else:
            await self.start("archiving")

    async def start(self, role: str, *, unless_started: bool = False) -> None:
        if self.gate is not None:
            self.gate.bind(asyncio.get_running_loop())
        await asyncio.to_thread(self.archiver.start, role, unless_started=unless_started)

    async def primary(self) -> None:
        await self.start("archiving")

    async def standby(self) -> None:
        await self.start("standby")

    async def stop(self) -> None:
        """At shutdown: what is published is uploaded first, for up to DRAIN_SECONDS."""
        await asyncio.to_thread(self.archiver.drain, DRAIN_SECONDS)

    def status(self) -> dict[str, object]:
        return self.progress.document()
