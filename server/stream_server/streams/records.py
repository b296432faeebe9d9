"""Keyed records: small state that other parts of the server keep durable through the engine.

A record is an opaque value under a key within a named space (the
subscription manager keeps one per subscription id in the space
``subscriptions``). A put or a delete goes through the same group-commit
pipeline as every stream operation: it is in the batch's WAL frame and its
LMDB transaction, acknowledged only once both are durable, replayed by
recovery, and so it travels with the batch wherever the batch goes. The
store exposes ``put_record`` and ``records``; this module checks what may
become a key, so that a bad name is refused before it can fail a whole batch.
"""

from __future__ import annotations

from stream_format.meta import MAX_KEY_BYTES, RECORD_SEP
from stream_server.engine.ops import DeleteRecord, PutRecord
from stream_server.streams.errors import BadRequest

# The space, a separator byte and the key form one LMDB key.
MAX_RECORD_KEY_BYTES = MAX_KEY_BYTES - len(RECORD_SEP)
# A record is rewritten whole on every change: large state belongs in a stream.
MAX_RECORD_VALUE_BYTES = 16 * 1024 * 1024


def _utf8(what: str, text: object) -> bytes:
    if not isinstance(text, str):
        raise BadRequest(f"record {what} must be a string, not {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"record {what} {text!r} is not valid Unicode text") from None


def check_space(space: str) -> None:
    """BadRequest unless ``space`` can name a space of records."""
    raw = _utf8("space", space)
    if not raw:
        raise BadRequest("record space is empty")
    if RECORD_SEP in raw:
        raise BadRequest(f"record space {space!r} contains a NUL character")
    if len(raw) > MAX_RECORD_KEY_BYTES:
        raise BadRequest(f"record space is longer than {MAX_RECORD_KEY_BYTES} bytes (UTF-8)")


def record_op(space: str, key: str, value: bytes | None) -> PutRecord | DeleteRecord:
    """The engine operation that sets (or, with None, removes) one record; BadRequest
    if the space, the key or the value cannot be stored."""
    check_space(space)
    raw_key = _utf8("key", key)
    if not raw_key:
        raise BadRequest("record key is empty")
    total = len(space.encode("utf-8")) + len(raw_key)
    if total > MAX_RECORD_KEY_BYTES:
        raise BadRequest(
            f"record space and key together are {total} bytes (UTF-8), "
            f"more than the {MAX_RECORD_KEY_BYTES} a key may hold"
        )
    if value is None:
        return DeleteRecord(space, key)
    if not isinstance(value, bytes | bytearray | memoryview):
        raise BadRequest(f"record value must be bytes, not {type(value).__name__}")
    data = bytes(value)
    if len(data) > MAX_RECORD_VALUE_BYTES:
        raise BadRequest(f"record value is {len(data)} bytes, more than {MAX_RECORD_VALUE_BYTES}")
    return PutRecord(space, key, data)
