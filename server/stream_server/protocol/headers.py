"""Parsing of the protocol's request headers; every refusal is a BadRequest."""

from __future__ import annotations

import re
from datetime import datetime

from stream_server.streams.errors import BadRequest
from stream_server.streams.store import Producer

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
