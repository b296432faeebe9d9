"""Keyed values: small state that other parts of the server keep durable through the engine.

A keyed value is an opaque value under a key within a named space (the
subscription manager keeps one per subscription id in the space
``subscriptions``). A put or a delete goes through the same group-commit
pipeline as every stream operation: it is in the batch's WAL frame and its
LMDB transaction, acknowledged only once both are durable, replayed by
recovery, and so it travels with the batch wherever the batch goes. The
store exposes ``put_keyed_value`` and ``keyed_values``; this module checks what may
become a key, so that a bad name is refused before it can fail a whole batch.
"""

from __future__ import annotations

from stream_format.meta import MAX_KEY_BYTES, SPACE_SEP
from stream_server.engine.ops import DeleteKeyedValue, PutKeyedValue
from stream_server.streams.errors import BadRequest

# The space, a separator byte and the key form one LMDB key.
MAX_SPACE_AND_KEY_BYTES = MAX_KEY_BYTES - len(SPACE_SEP)
# A keyed value is rewritten whole on every change: large state belongs in a stream.
MAX_KEYED_VALUE_BYTES = 16 * 1024 * 1024


def _utf8(what: str, text: object) -> bytes:
    if not isinstance(text, str):
        raise BadRequest(f"the {what} of a keyed value must be a string, not {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            f"the {what} {text!r} of a keyed value is not valid Unicode text"
        ) from None


def check_space(space: str) -> None:
    """BadRequest unless ``space`` can name a space of keyed values."""
    raw = _utf8("space", space)
    if not raw:
        raise BadRequest("the space of a keyed value is empty")
    if SPACE_SEP in raw:
        raise BadRequest(f"the space {space!r} of a keyed value contains a NUL character")
    if len(raw) > MAX_SPACE_AND_KEY_BYTES:
        raise BadRequest(
            f"the space of a keyed value is longer than {MAX_SPACE_AND_KEY_BYTES} bytes (UTF-8)"
        )


def keyed_value_op(space: str, key: str, value: bytes | None) -> PutKeyedValue | DeleteKeyedValue:
    """The engine operation that sets (or, with None, removes) one keyed value; BadRequest
    if the space, the key or the value cannot be stored."""
    check_space(space)
    raw_key = _utf8("key", key)
    if not raw_key:
        raise BadRequest("the key of a keyed value is empty")
    total = len(space.encode("utf-8")) + len(raw_key)
    if total > MAX_SPACE_AND_KEY_BYTES:
        raise BadRequest(
            f"the space and key of a keyed value together are {total} bytes (UTF-8), "
            f"more than the {MAX_SPACE_AND_KEY_BYTES} a key may hold"
        )
    if value is None:
        return DeleteKeyedValue(space, key)
    if not isinstance(value, bytes | bytearray | memoryview):
        raise BadRequest(f"a keyed value must be bytes, not {type(value).__name__}")
    data = bytes(value)
    if len(data) > MAX_KEYED_VALUE_BYTES:
        raise BadRequest(f"a keyed value is {len(data)} bytes, more than {MAX_KEYED_VALUE_BYTES}")
    return PutKeyedValue(space, key, data)
