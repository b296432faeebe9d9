"""The engine's fail-closed state, and the points a fault test stops it at.

Every part of the engine that writes (a batch, frames from a primary, a
checkpoint's flush) fails the same way: once the disk's state is unknown (a
failed fdatasync, a commit that failed after its frame was flushed or
shipped) the engine refuses every write until a restart, whose recovery
replays the WAL. One class holds that state so that each part reads and sets
it alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stream_server.engine.errors import StorageFailed

log = logging.getLogger("stream_server.engine")


class FailClosed:
    """Mixed into ``Engine``: why it failed closed (None while it has not), and the
    fault hook (``stream_server.faults``) called with a stage name between the steps
    of a batch, so that a fault test can stop the process there."""

    failed: str | None
    fault_hook: Callable[[str], None] | None

    def _refuse_when_failed(self) -> None:
        if self.failed:
            raise StorageFailed(f"storage failed closed: {self.failed}")

    def _fail(self, reason: str) -> None:
        if not self.failed:
            self.failed = reason
            log.critical("storage failed closed, refusing all writes until restart: %s", reason)

    def _hook(self, stage: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(stage)
