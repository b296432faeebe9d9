"""Storage failures, as the stream layer needs to tell them apart."""

from __future__ import annotations

import errno
import os

import lmdb

# Out of space, whichever way the system says it: the disk, or the user's quota.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class StorageError(Exception):
    """A batch could not be made durable; nothing of it is visible."""

    def __init__(self, message: str, *, disk_full: bool = False) -> None:
        super().__init__(message)
        self.disk_full = disk_full


class StorageFailed(StorageError):
    """The engine failed closed (a flush failed): it accepts no more writes until restarted."""


class DamagedStream(Exception):
    """A stream's log does not match its checksums; its bytes are not served."""


class HeadDropped(Exception):
    """A read reached below the stream's retained start: retention dropped those bytes
    while the read was under way (not damage: the caller answers as for an offset
    before the start)."""

    def __init__(self, start: int) -> None:
        super().__init__(f"data before unit {start} was dropped by retention")
        self.start = start


def from_os_error(what: str, exc: OSError) -> StorageError:
    """A failed write, classified by its errno."""
    return StorageError(f"{what}: {exc.strerror or exc}", disk_full=exc.errno in _NO_SPACE)


def from_lmdb_error(what: str, exc: lmdb.Error) -> StorageError:
    """A failed LMDB commit, classified by its type, else by its errno.

    py-lmdb raises a class per LMDB error code, but an error from the system
    (a failed write) comes as the base class with only the C library's
    ``strerror`` text for the errno; that text is what is compared, for the
    errnos that mean "no space".
    """
    no_space = isinstance(exc, lmdb.MapFullError) or any(
        str(exc).endswith(os.strerror(code)) for code in _NO_SPACE
    )
    return StorageError(f"{what}: {exc}", disk_full=no_space)
