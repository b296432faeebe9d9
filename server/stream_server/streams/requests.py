"""What callers ask the store, and what it answers: plain values, no behaviour.

The protocol layer builds these from parsed headers; nothing here knows HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_format.records import Producer
from stream_server.engine import BatchStats
from stream_server.streams.model import Stream


@dataclass(slots=True)
class ForkRequest:
    source: str
    offset: int | None  # unit; None means the source's tail
    sub_offset: int = 0


@dataclass(slots=True)
class CreateRequest:
    path: str
    content_type: str | None
    body: bytes = b""
    ttl: int | None = None
    expires_at: str | None = None
    expires_at_ts: float | None = None
    closed: bool = False
    fork: ForkRequest | None = None


@dataclass(slots=True)
class AppendRequest:
    path: str
    content_type: str | None
    body: bytes
    stream_seq: str | None = None
    producer: Producer | None = None
    close: bool = False


@dataclass(slots=True)
class CreateResult:
    stream: Stream
    created: bool
    tail: int
    closed: bool


@dataclass(slots=True)
class AppendResult:
    tail: int
    closed: bool
    duplicate: bool = False
    producer: Producer | None = None
    appended: bool = False  # new data was written (not a duplicate, not close-only)
    batch: BatchStats | None = None  # where the commit's time went
    # The replica set's term it is acknowledged under (0: not in a set): its batch's, or
    # for an answer that writes nothing (a duplicate, a close already made) the term the
    # primary answers in, which a client checks its acknowledgements by all the same.
    term: int = 0


@dataclass(slots=True)
class ReadResult:
    payloads: list[bytes | memoryview]  # memoryviews of the log where read from disk
    start: int
    next: int
    tail: int  # committed tail when the read was served
    closed: bool  # closed and the read reached the final unit

    @property
    def up_to_date(self) -> bool:
        return self.next >= self.tail
