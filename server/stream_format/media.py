"""Media types: which streams are JSON (one unit per message) and which are bytes."""

from __future__ import annotations

import functools

from stream_format.records import KIND_BYTES, KIND_JSON

JSON_TYPE = "application/json"


@functools.lru_cache(maxsize=256)
def media_type(content_type: str) -> str:
    """The comparable part of a content type: lower-cased, parameters dropped. Cached:
    every append compares its type with the stream's, and clients send a few types."""
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    return media_type(content_type) == JSON_TYPE


def record_kind(content_type: str) -> int:
    """The record kind a stream of this content type holds."""
    return KIND_JSON if is_json(content_type) else KIND_BYTES
