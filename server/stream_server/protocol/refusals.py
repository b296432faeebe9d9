"""A refused operation as a response: the protocol's status code, headers and a reason.

The store raises ``StreamError`` subclasses and knows nothing of HTTP; this
is the one place that decides what each refusal looks like on the wire, so a
handler never builds an error response itself. A refusal is looked up by its
class, the most specific first (``RENDERERS``), as Starlette finds an
exception's handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stream_format.offsets import format_offset
from stream_server.protocol.context import TRUE
from stream_server.protocol.headers import (
    CONNECTION,
    PRODUCER_EPOCH,
    PRODUCER_EXPECTED_SEQ,
    PRODUCER_RECEIVED_SEQ,
    RETRY_AFTER,
    STREAM_CLOSED,
    STREAM_EARLIEST_OFFSET,
    STREAM_NEXT_OFFSET,
)
from stream_server.protocol.http import Headers, PayloadTooLarge, RequestTimeout, text_headers
from stream_server.protocol.live import TooManyRequests
from stream_server.streams.errors import (
    BadRequest,
    Conflict,
    Damaged,
    Gone,
    NotFound,
    OffsetGone,
    ProducerFenced,
    SequenceGap,
    StreamClosed,
    StreamError,
    TooLarge,
    Unavailable,
)


class Decided(StreamError):
    """A refusal decided before the protocol's rules, carried whole: the writer's answer
    to a worker process (recovery not finished, a standby's or the archive's refusal of
    a write), which the worker sends as it came."""

    def __init__(self, status: int, headers: Headers, body: bytes) -> None:
        super().__init__(body.decode("utf-8", "replace").rstrip("\n"))
        self.status = status
        self.extra = headers


def _decided(exc: Decided) -> tuple[int, Headers]:
    return exc.status, list(exc.extra)


def error_response(exc: StreamError) -> tuple[int, Headers, bytes]:
    """Status, headers and a short plain-text reason for a refused operation: the
    renderer of the nearest class in ``exc``'s MRO (Starlette's lookup by class)."""
    status, extra = 500, list[tuple[bytes, bytes]]()  # a StreamError nobody named
    for cls in type(exc).__mro__:
        render = RENDERERS.get(cls)
        if render is not None:
            status, extra = render(exc)
            break
    return status, text_headers(extra), (exc.message + "\n").encode()


Render = Callable[[Any], tuple[int, Headers]]


def _fixed(status: int, extra: Headers | None = None) -> Render:
    return lambda _: (status, list(extra or []))


def _closed(exc: StreamClosed) -> tuple[int, Headers]:
    return 409, [
        (STREAM_CLOSED.raw, TRUE),
        (STREAM_NEXT_OFFSET.raw, format_offset(exc.final_unit).encode()),
    ]


def _gap(exc: SequenceGap) -> tuple[int, Headers]:
    return 409, [
        (PRODUCER_EXPECTED_SEQ.raw, str(exc.expected).encode()),
        (PRODUCER_RECEIVED_SEQ.raw, str(exc.received).encode()),
    ]


def _fenced(exc: ProducerFenced) -> tuple[int, Headers]:
    return 403, [(PRODUCER_EPOCH.raw, str(exc.current_epoch).encode())]


def _offset_gone(exc: OffsetGone) -> tuple[int, Headers]:
    return 410, [(STREAM_EARLIEST_OFFSET.raw, format_offset(exc.earliest).encode())]


def _unavailable(exc: Unavailable) -> tuple[int, Headers]:
    if exc.disk_full:
        return 507, [(RETRY_AFTER.raw, b"5")]
    return 503, [(RETRY_AFTER.raw, b"1")]


# Each refusal class and how it looks on the wire; a subclass not listed gets its
# nearest listed base's (SequenceGap and StreamClosed are Conflicts with headers).
RENDERERS: dict[type[StreamError], Render] = {
    StreamClosed: _closed,
    SequenceGap: _gap,
    ProducerFenced: _fenced,
    Conflict: _fixed(409),
    BadRequest: _fixed(400),
    NotFound: _fixed(404),
    OffsetGone: _offset_gone,
    Gone: _fixed(410),
    PayloadTooLarge: _fixed(413),
    TooLarge: _fixed(413),
    TooManyRequests: _fixed(429, [(RETRY_AFTER.raw, b"1")]),
    RequestTimeout: _fixed(408, [(CONNECTION.raw, b"close")]),
    Unavailable: _unavailable,
    Damaged: _fixed(500),
    Decided: _decided,
}
