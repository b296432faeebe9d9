"""``--archive-mode required``: a batch is acknowledged only once the archive holds it.

The commit pipeline holds each durable batch at its ack gate (engine/pipeline.py)
until the gate lets it through. On a single node the archive's gate is the whole
gate; in a replica set it comes after the set's own (replication/primary/shipping.py):
a batch is acknowledged once the in-sync standbys *and* the archive hold it.
The archiver uploads at once in this mode and wakes the gate from its thread
each time the archived lsn moves (``progressed``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from stream_server.archive.progress import ArchiveProgress
from stream_server.engine.replica import AckGate
from stream_server.engine.storage_errors import StorageError
from stream_server.replication.primary.signal import Signal

WAIT_SECONDS = 30.0  # a batch's waiters hear 503 after this long at the gate


class ArchiveBehind(StorageError):
    """Durable here, not yet archived: the outcome is unknown to the client (503)."""


class ArchiveGate:
    def __init__(self, progress: ArchiveProgress, wait_seconds: float = WAIT_SECONDS) -> None:
        self.progress = progress
        self.wait_seconds = wait_seconds
        self.changed = Signal()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def progressed(self, lsn: int) -> None:
        """The archived lsn moved (called on the archiver's thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.changed.notify)

    async def wait(self, lsn: int, late: Callable[[StorageError], None]) -> bool:
        while self.progress.archived_lsn < lsn:
            await self.changed.wait(1.0)
        return True

    def overdue(self) -> StorageError:
        return ArchiveBehind(
            "not acknowledged: the archive does not hold this write yet "
            f"({self.progress.last_error or 'uploading'}); retry"
        )


class BothGates:
    """The replica set's gate, then the archive's."""

    def __init__(self, first: AckGate, archive: ArchiveGate) -> None:
        self.first = first
        self.archive = archive
        self.wait_seconds = max(first.wait_seconds, archive.wait_seconds)

    async def wait(self, lsn: int, late: Callable[[StorageError], None]) -> bool:
        return await self.first.wait(lsn, late) and await self.archive.wait(lsn, late)

    def overdue(self) -> StorageError:
        if self.archive.progress.lag_frames:
            return self.archive.overdue()
        return self.first.overdue()
