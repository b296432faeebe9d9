"""Why a stream operation was refused. The protocol layer maps each to a status code."""

from __future__ import annotations


class StreamError(Exception):
    """Base: the operation changed nothing."""

    def __init__(self, message: str, **headers: str) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers


class BadRequest(StreamError):
    pass


class NotFound(StreamError):
    pass


class Gone(StreamError):
    """The stream was deleted while forks still read through it."""


class OffsetGone(Gone):
    """The offset is before the earliest retained data (retention dropped it): 410, with
    the earliest offset a read may ask for."""

    def __init__(self, earliest: int) -> None:
        super().__init__("offset is before the earliest retained data (dropped by retention)")
        self.earliest = earliest


class Conflict(StreamError):
    pass


class StreamClosed(Conflict):
    """An append to a closed stream; carries the final offset."""

    def __init__(self, message: str, final_unit: int) -> None:
        super().__init__(message)
        self.final_unit = final_unit


class ProducerFenced(StreamError):
    """A stale producer epoch (a zombie): 403 with the current epoch."""

    def __init__(self, current_epoch: int) -> None:
        super().__init__(f"producer epoch is stale; current epoch is {current_epoch}")
        self.current_epoch = current_epoch


class SequenceGap(Conflict):
    def __init__(self, expected: int, received: int) -> None:
        super().__init__(f"producer sequence gap: expected {expected}, received {received}")
        self.expected = expected
        self.received = received


class Unavailable(StreamError):
    """Storage could not take the write (disk full, failed closed); nothing was applied."""

    def __init__(self, message: str, *, disk_full: bool = False) -> None:
        super().__init__(message)
        self.disk_full = disk_full


class Damaged(StreamError):
    """The stream's log failed its checksums: its bytes are not served."""


class TooLarge(StreamError):
    """The request asks for more than a limit allows (413)."""
