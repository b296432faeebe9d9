"""Stream paths from request URLs: refuse anything ambiguous before it reaches the store.

Segment files are named by stream id, never by path, so a path cannot escape
the data directory; these checks keep distinct spellings from meaning the same
stream and keep hostile input out of logs and metadata.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from stream_server.streams.errors import BadRequest, NotFound
from stream_server.streams.path_rules import path_problem

RESERVED_SEGMENT = "__ds"


def stream_path(raw_path: bytes, base: bytes, *, max_bytes: int, max_segment: int) -> str:
    """The stream path below ``base`` (no leading slash), validated.

    The base must be spelt out literally in the raw path: routing looks at the
    decoded path, so ``/v1/stre%61m/x`` reaches here too, and cutting the base's
    length off its raw form would name a different stream (``m/x``).
    """
    if not raw_path.startswith(base):
        raise BadRequest("the stream base path must not be percent-encoded")
    rest = raw_path[len(base) :]
    if not rest:
        raise NotFound("no stream path")
    low = rest.lower()
    for bad in (b"%2f", b"%5c", b"%00"):
        if bad in low:
            raise BadRequest("encoded separators and NUL are not allowed in stream paths")
    if len(rest) > max_bytes:
        raise BadRequest(f"stream path longer than {max_bytes} bytes")
    try:
        path = unquote_to_bytes(rest).decode("utf-8")
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("stream path is not valid percent-encoded UTF-8") from None
    problem = path_problem(path, max_bytes=None, max_segment=max_segment)
    if problem is not None:
        raise BadRequest(f"stream path: {problem}")
    return path


def is_reserved(path: str) -> bool:
    return path.split("/", 1)[0] == RESERVED_SEGMENT
