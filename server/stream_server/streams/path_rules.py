"""What a stream path may be, once decoded: one rule for stream requests and subscription links.

A subscription may name streams that do not exist yet (explicit links, wake
streams); if it accepted a path that no stream request can create, the link
would wait forever for a stream that can never exist. So both sides check
a path by this rule: no control characters or backslashes, no empty, ``.``
or ``..`` segment, at most ``MAX_SEGMENT_BYTES`` per segment and
``MAX_PATH_BYTES`` in all (UTF-8). The total is LMDB's key limit: a path is a
key of the metadata index (``stream_format.meta.MAX_KEY_BYTES``).
"""

from __future__ import annotations

import re

from stream_format.meta import MAX_KEY_BYTES

MAX_PATH_BYTES = MAX_KEY_BYTES
MAX_SEGMENT_BYTES = 255


def path_problem(
    path: str, *, max_bytes: int | None = MAX_PATH_BYTES, max_segment: int = MAX_SEGMENT_BYTES
) -> str | None:
    """Why ``path`` cannot name a stream (a phrase to finish a sentence), or None.

    ``max_bytes`` None leaves the total to the caller (the protocol checks it
    on the raw path, and the store on create).
    """
    if max_bytes is not None and len(path.encode("utf-8", "surrogatepass")) > max_bytes:
        return f"longer than {max_bytes} bytes"
    bad = _BAD.search(path)  # one scan: every request's path comes through here
    if bad is not None:
        if bad.group(1) is not None or _CONTROL.search(path) is not None:
            return "control characters and backslashes are not allowed"
        return "empty, '.' and '..' segments are not allowed"
    for seg in path.split("/"):
        if len(seg.encode("utf-8", "surrogatepass")) > max_segment:
            return f"a segment is longer than {max_segment} bytes"
    return None


# A control character or backslash (group 1), or an empty, "." or ".." segment.
_BAD = re.compile(r"([\x00-\x1f\x7f\\])|(?:\A|/)\.{0,2}(?:/|\Z)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
