"""The protocol's headers: every name, once, and the parsing of request values.

Each name is written here once, in the spelling the protocol documents, and
every module of the protocol layer (and the CORS lists in ``http``) takes it
from here in the form it needs: ``key`` to look a request header up (the
request's headers are keyed in lower case, ``http.request_headers``), ``raw``
to send it (lower-case bytes, as ASGI wants), ``name`` where it is listed
for people and browsers. Parsing refuses with a BadRequest.
"""

from __future__ import annotations

import re
from datetime import datetime

from stream_format.records import Producer
from stream_server.streams.errors import BadRequest


class Header:
    """One header name in its three forms (plain attributes: read on every request)."""

    __slots__ = ("key", "name", "raw")

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = name.lower()
        self.raw = self.key.encode("ascii")

    def __repr__(self) -> str:
        return f"Header({self.name!r})"


# The protocol's own (PROTOCOL.md).
STREAM_NEXT_OFFSET = Header("Stream-Next-Offset")
STREAM_CURSOR = Header("Stream-Cursor")
STREAM_UP_TO_DATE = Header("Stream-Up-To-Date")
STREAM_CLOSED = Header("Stream-Closed")
STREAM_TTL = Header("Stream-TTL")
STREAM_EXPIRES_AT = Header("Stream-Expires-At")
STREAM_SEQ = Header("Stream-Seq")
STREAM_FORKED_FROM = Header("Stream-Forked-From")
STREAM_FORK_OFFSET = Header("Stream-Fork-Offset")
STREAM_FORK_SUB_OFFSET = Header("Stream-Fork-Sub-Offset")
STREAM_SSE_DATA_ENCODING = Header("Stream-SSE-Data-Encoding")
# Where a read may start once retention dropped a stream's head: sent with a 410
# for an offset before it, and by HEAD (docs/retention.md).
STREAM_EARLIEST_OFFSET = Header("Stream-Earliest-Offset")
PRODUCER_ID = Header("Producer-Id")
PRODUCER_EPOCH = Header("Producer-Epoch")
PRODUCER_SEQ = Header("Producer-Seq")
PRODUCER_EXPECTED_SEQ = Header("Producer-Expected-Seq")
PRODUCER_RECEIVED_SEQ = Header("Producer-Received-Seq")
# This project's: the replica set's term an append was acknowledged at (a replica set's
# primary only), so that a client, or a test's history, knows which primary took it.
REPLICATION_TERM = Header("Replication-Term")

# HTTP's, as the protocol uses them.
AUTHORIZATION = Header("Authorization")
ALLOW = Header("Allow")
CACHE_CONTROL = Header("Cache-Control")
CONNECTION = Header("Connection")
CONTENT_LENGTH = Header("Content-Length")
CONTENT_TYPE = Header("Content-Type")
ETAG = Header("ETag")
HOST = Header("Host")
IF_NONE_MATCH = Header("If-None-Match")
LAST_EVENT_ID = Header("Last-Event-ID")
LOCATION = Header("Location")
RETRY_AFTER = Header("Retry-After")
VARY = Header("Vary")
WWW_AUTHENTICATE = Header("WWW-Authenticate")
# On every response (``http.COMMON``, ``http.PREFLIGHT``): CORS, and the browser's
# security headers; and one for proxies in front of an SSE response.
ACCESS_CONTROL_ALLOW_ORIGIN = Header("Access-Control-Allow-Origin")
ACCESS_CONTROL_EXPOSE_HEADERS = Header("Access-Control-Expose-Headers")
ACCESS_CONTROL_ALLOW_METHODS = Header("Access-Control-Allow-Methods")
ACCESS_CONTROL_ALLOW_HEADERS = Header("Access-Control-Allow-Headers")
ACCESS_CONTROL_MAX_AGE = Header("Access-Control-Max-Age")
X_CONTENT_TYPE_OPTIONS = Header("X-Content-Type-Options")
CROSS_ORIGIN_RESOURCE_POLICY = Header("Cross-Origin-Resource-Policy")
X_ACCEL_BUFFERING = Header("X-Accel-Buffering")

_DECIMAL = re.compile(r"\A(0|[1-9][0-9]*)\Z")
MAX_SAFE_INTEGER = 2**53 - 1


def non_negative_int(value: str, name: str, *, maximum: int = MAX_SAFE_INTEGER) -> int:
    if not _DECIMAL.match(value):
        raise BadRequest(f"{name} must be a non-negative decimal integer")
    n = int(value)
    if n > maximum:
        raise BadRequest(f"{name} is too large")
    return n


def is_true(value: str | None) -> bool:
    """Stream-Closed counts only when exactly 'true' (any case); anything else is absence."""
    return value is not None and value.strip().lower() == "true"


def parse_ttl(value: str | None) -> int | None:
    if value is None:
        return None
    return non_negative_int(value.strip(), "Stream-TTL")


_RFC3339 = re.compile(r"\A\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})\Z")


def parse_expires_at(value: str | None) -> tuple[str, float] | None:
    if value is None:
        return None
    text = value.strip()
    if not _RFC3339.match(text):
        raise BadRequest("Stream-Expires-At must be an RFC 3339 timestamp with a time zone")
    try:
        ts = datetime.fromisoformat(text.replace("z", "Z")).timestamp()
    except ValueError:
        raise BadRequest("Stream-Expires-At is not a valid date and time") from None
    return text, ts


def parse_producer(pid: str | None, epoch: str | None, seq: str | None) -> Producer | None:
    given = [v is not None for v in (pid, epoch, seq)]
    if not any(given):
        return None
    if not all(given):
        raise BadRequest("Producer-Id, Producer-Epoch and Producer-Seq must be sent together")
    assert pid is not None and epoch is not None and seq is not None
    if not pid.strip():
        raise BadRequest("Producer-Id must not be empty")
    return Producer(
        pid,
        non_negative_int(epoch.strip(), "Producer-Epoch"),
        non_negative_int(seq.strip(), "Producer-Seq"),
    )
