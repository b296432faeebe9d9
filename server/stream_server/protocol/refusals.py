"""A refused operation as a response: the protocol's status code, headers and a reason.

The store raises ``StreamError`` subclasses and knows nothing of HTTP; this
is the one place that decides what each refusal looks like on the wire, so a
handler never builds an error response itself. The order of the checks
matters where the classes are related (a more specific refusal first).
"""

from __future__ import annotations

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


def error_response(exc: StreamError) -> tuple[int, Headers, bytes]:
    """Status, headers and a short plain-text reason for a refused operation."""
    extra: Headers = []
    if isinstance(exc, StreamClosed):
        status = 409
        extra = [
            (STREAM_CLOSED.raw, TRUE),
            (STREAM_NEXT_OFFSET.raw, format_offset(exc.final_unit).encode()),
        ]
    elif isinstance(exc, SequenceGap):
        status = 409
        extra = [
            (PRODUCER_EXPECTED_SEQ.raw, str(exc.expected).encode()),
            (PRODUCER_RECEIVED_SEQ.raw, str(exc.received).encode()),
        ]
    elif isinstance(exc, ProducerFenced):
        status = 403
        extra = [(PRODUCER_EPOCH.raw, str(exc.current_epoch).encode())]
    elif isinstance(exc, Conflict):
        status = 409
    elif isinstance(exc, BadRequest):
        status = 400
    elif isinstance(exc, NotFound):
        status = 404
    elif isinstance(exc, OffsetGone):
        status = 410
        extra = [(STREAM_EARLIEST_OFFSET.raw, format_offset(exc.earliest).encode())]
    elif isinstance(exc, Gone):
        status = 410
    elif isinstance(exc, PayloadTooLarge | TooLarge):
        status = 413
    elif isinstance(exc, TooManyRequests):
        status = 429
        extra = [(RETRY_AFTER.raw, b"1")]
    elif isinstance(exc, RequestTimeout):
        status = 408
        extra = [(CONNECTION.raw, b"close")]
    elif isinstance(exc, Unavailable):
        status = 507 if exc.disk_full else 503
        extra = [(RETRY_AFTER.raw, b"5" if exc.disk_full else b"1")]
    elif isinstance(exc, Damaged):
        status = 500
    else:
        status = 500
    return status, text_headers(extra), (exc.message + "\n").encode()
