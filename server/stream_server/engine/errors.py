"""Storage failures, as the stream layer needs to tell them apart."""

from __future__ import annotations


class StorageError(Exception):
    """A batch could not be made durable; nothing of it is visible."""

    def __init__(self, message: str, *, disk_full: bool = False) -> None:
        super().__init__(message)
        self.disk_full = disk_full


class StorageFailed(StorageError):
    """The engine failed closed (a flush failed): it accepts no more writes until restarted."""


class DamagedStream(Exception):
    """A stream's log does not match its checksums; its bytes are not served."""
