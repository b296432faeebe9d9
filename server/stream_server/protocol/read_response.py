"""A read's answer on the wire: its headers, its ETag, and its body.

Catch-up reads, long-polls that found data, and reads at ``now`` all answer
the same way, so the headers are built in one place: the next offset, the
cache policy (private once auth is on, so a shared cache never hands one
client's stream to another), up-to-date and closed flags, the cursor for
live reads, and an ETag that names exactly the range returned (stream
identity, start, end, closed), so a revalidation is a 304 only when the
same bytes would be sent again. JSON streams answer with one array of the
stored messages, joined without re-serialising them.
"""

from __future__ import annotations

from collections.abc import Sequence

from stream_format.offsets import format_offset
from stream_server.protocol.context import TRUE, Context
from stream_server.protocol.headers import (
    AUTHORIZATION,
    CACHE_CONTROL,
    CONTENT_TYPE,
    ETAG,
    IF_NONE_MATCH,
    STREAM_CLOSED,
    STREAM_CURSOR,
    STREAM_NEXT_OFFSET,
    STREAM_UP_TO_DATE,
    VARY,
)
from stream_server.protocol.http import Headers, Send, respond
from stream_server.streams.model import Stream
from stream_server.streams.requests import ReadResult


def read_headers(
    ctx: Context,
    s: Stream,
    r: ReadResult,
    h: dict[str, str],
    *,
    etag: bool,
    cache: bytes | None = None,
    cursor: str | None = None,
) -> tuple[Headers, bool]:
    """The headers of a read answered with ``r``, and whether the client's ETag matches."""
    hs: Headers = [
        (CONTENT_TYPE.raw, s.meta.content_type.encode()),
        (STREAM_NEXT_OFFSET.raw, format_offset(r.next).encode()),
        (CACHE_CONTROL.raw, cache or ctx.cache_read),
    ]
    if ctx.auth is not None:
        hs.append((VARY.raw, AUTHORIZATION.raw))
    if r.up_to_date:
        hs.append((STREAM_UP_TO_DATE.raw, TRUE))
    if r.closed:
        hs.append((STREAM_CLOSED.raw, TRUE))
    if cursor is not None and not r.closed:
        hs.append((STREAM_CURSOR.raw, cursor.encode()))
    if etag:
        tag = f'"{s.id}:{format_offset(r.start)}:{format_offset(r.next)}{":c" if r.closed else ""}"'
        hs.append((ETAG.raw, tag.encode()))
        return hs, _etag_matches(h.get(IF_NONE_MATCH.key), tag)
    return hs, False


async def send_read(
    ctx: Context,
    send: Send,
    s: Stream,
    r: ReadResult,
    h: dict[str, str],
    *,
    etag: bool = True,
    cache: bytes | None = None,
    cursor: str | None = None,
) -> None:
    hs, not_modified = read_headers(ctx, s, r, h, etag=etag, cache=cache, cursor=cursor)
    if not_modified:
        await respond(send, 304, hs)
        return
    body: bytes | memoryview
    if s.is_json:
        body = json_array(r.payloads)
    else:
        body = r.payloads[0] if len(r.payloads) == 1 else b"".join(r.payloads)
    await respond(send, 200, hs, body)


def json_array(messages: Sequence[bytes | memoryview]) -> bytes:
    """``[m1,m2,...]`` with a single copy of the message bytes."""
    if not messages:
        return b"[]"
    parts: list[bytes | memoryview] = [b"["]
    for m in messages:
        parts.append(m)
        parts.append(b",")
    parts[-1] = b"]"
    return b"".join(parts)


def _etag_matches(header: str | None, tag: str) -> bool:
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(part.strip().removeprefix("W/") == tag for part in header.split(","))
