"""JSON mode: validate a body and flatten one level of array into messages."""

from __future__ import annotations

import json

import orjson

from stream_server.streams.errors import BadRequest


def _loads(body: bytes):
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:  # orjson refuses integers past 64 bits, which JSON itself allows
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from None


def _dumps(value) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def split_messages(body: bytes, *, allow_empty_array: bool) -> list[bytes]:
    """The messages a JSON body stores: an array's elements, or the one value.

    An empty array is refused on append (a no-op that hides a client bug) and
    allowed on create (no initial messages).
    """
    value = _loads(body)
    if isinstance(value, list):
        if not value and not allow_empty_array:
            raise BadRequest("empty JSON array: nothing to append")
        return [_dumps(item) for item in value]
    return [_dumps(value)]
