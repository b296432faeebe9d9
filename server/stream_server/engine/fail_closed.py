"""The engine's fail-closed state, and the points a fault test stops it at.

Every part of the engine that writes (a batch, frames from a primary, a
checkpoint's flush, the LMDB writes that wait for a later transaction) fails
the same way: once the disk's state is unknown (a failed fdatasync, a commit
that failed after its frame was flushed or shipped) the engine refuses every
write until a restart, whose recovery replays the WAL. One object holds that
state and each part is handed the same one, so that a failure any part sees
stops them all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stream_server.engine.storage_errors import StorageFailed

log = logging.getLogger("stream_server.engine")


class FailClosed:
    """Why the engine failed closed (None while it has not), and the fault hook
    (``stream_server.faults``) called with a stage name between the steps of a batch,
    so that a fault test can stop the process there."""

    def __init__(self, fault_hook: Callable[[str], None] | None = None) -> None:
        self.failed: str | None = None
        self.fault_hook = fault_hook

    def error(self) -> StorageFailed:
        """What a write hears once the engine has failed closed."""
        return StorageFailed(f"storage failed closed: {self.failed}")

    def refuse_when_failed(self) -> None:
        if self.failed:
            raise self.error()

    def fail(self, reason: str) -> None:
        """Fail closed for ``reason``; the first reason stays (it is the cause, the
        later ones its consequences)."""
        if not self.failed:
            self.failed = reason
            log.critical("storage failed closed, refusing all writes until restart: %s", reason)

    def hook(self, stage: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(stage)
