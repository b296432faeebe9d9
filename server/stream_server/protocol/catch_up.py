"""GET and HEAD: where a read starts, and the catch-up reads that answer at once.

A GET resolves its offset (``-1`` is the earliest retained unit, ``now`` the
committed tail, anything past the tail is a 400, anything before the
earliest retained unit a 410 with ``Stream-Earliest-Offset``) against the stream as it is now, then
either hands over to a live read (long-poll or SSE, in ``live_reads``,
holding a reader slot for as long as it runs) or answers with what is
committed. A catch-up read touches only the bytes it returns: one bounded
read for JSON and small binary ranges, and for larger binary ranges one
response streamed in chunks, so memory stays bounded whatever the range.
"""

from __future__ import annotations

import asyncio
import logging

from stream_format.offsets import NOW, START, format_offset
from stream_server.protocol import live_reads
from stream_server.protocol.context import (
    CACHE_NONE,
    READ_CHUNK_BYTES,
    TRUE,
    Context,
    offset_unit,
)
from stream_server.protocol.headers import (
    CACHE_CONTROL,
    CONTENT_LENGTH,
    CONTENT_TYPE,
    STREAM_CLOSED,
    STREAM_EARLIEST_OFFSET,
    STREAM_EXPIRES_AT,
    STREAM_NEXT_OFFSET,
    STREAM_TTL,
)
from stream_server.protocol.http import COMMON, Headers, Receive, Scope, Send, query_params, respond
from stream_server.protocol.live import Hangup
from stream_server.protocol.read_response import read_headers, send_read
from stream_server.streams.errors import BadRequest, OffsetGone, StreamError
from stream_server.streams.model import Stream
from stream_server.streams.requests import ReadResult

log = logging.getLogger("stream_server.protocol")


async def head(
    ctx: Context,
    scope: Scope,
    receive: Receive,
    send: Send,
    path: str,
    h: dict[str, str],
    client: str,
) -> None:
    s = await ctx.store.open(path)
    hs = [*_meta_headers(s, s.tail), (CACHE_CONTROL.raw, CACHE_NONE)]
    first = ctx.store.earliest(s)
    if first > 0:  # retention dropped the head: where a read may start now
        hs.append((STREAM_EARLIEST_OFFSET.raw, format_offset(first).encode()))
    await respond(send, 200, hs)


def _meta_headers(s: Stream, next_unit: int) -> Headers:
    hs: Headers = [
        (CONTENT_TYPE.raw, s.meta.content_type.encode()),
        (STREAM_NEXT_OFFSET.raw, format_offset(next_unit).encode()),
    ]
    if s.meta.ttl is not None:
        hs.append((STREAM_TTL.raw, str(s.meta.ttl).encode()))
    if s.meta.expires_at is not None:
        hs.append((STREAM_EXPIRES_AT.raw, s.meta.expires_at.encode()))
    if s.meta.closed and next_unit >= s.tail:
        hs.append((STREAM_CLOSED.raw, TRUE))
    return hs


async def get(  # noqa: C901 - the protocol's order of checks for a read, read in one place
    ctx: Context,
    scope: Scope,
    receive: Receive,
    send: Send,
    path: str,
    h: dict[str, str],
    client: str,
) -> None:
    q = query_params(scope)
    live = q.get("live")
    if live not in (None, "long-poll", "sse"):
        raise BadRequest("live must be 'long-poll' or 'sse'")
    raw_offset = q.get("offset")
    if live is not None and raw_offset is None:
        raise BadRequest("live reads need an offset")
    offset = START if raw_offset is None else offset_unit(raw_offset)
    s = await ctx.store.open(path, touch=True)
    first = ctx.store.earliest(s)
    if offset == START:
        unit = first  # the earliest retained data (0 until retention drops some)
    elif offset == NOW:
        unit = s.tail
    else:
        unit = offset
        if unit > s.tail:
            raise BadRequest("offset is past the end of the stream")
        if unit < first:
            raise OffsetGone(first)
    if live is not None:
        async with ctx.slots.held(live, client):
            hangup = Hangup(receive)
            try:
                if live == "sse":
                    await live_reads.sse(
                        ctx, send, s, unit, q.get("cursor"), hangup, from_start=offset == START
                    )
                else:
                    await live_reads.long_poll(
                        ctx, send, s, unit, h, q.get("cursor"), hangup, from_start=offset == START
                    )
            finally:
                hangup.close()
        return
    if offset == NOW and live is None:
        await send_read(
            ctx,
            send,
            s,
            ReadResult([], unit, unit, s.tail, s.meta.closed),
            h,
            etag=False,
            cache=CACHE_NONE,
        )
        return
    if not s.is_json and s.tail - unit > ctx.read_chunk:
        await _send_streamed_read(ctx, send, s, unit, h, from_start=offset == START)
        return
    result = await live_reads.read_from(ctx, s, unit, from_start=offset == START)
    ctx.observe_read(result)
    await send_read(ctx, send, s, result, h)


async def _send_streamed_read(
    ctx: Context, send: Send, s: Stream, unit: int, h: dict[str, str], *, from_start: bool
) -> None:
    """A large binary catch-up in one response, sent in chunks as they are read.

    Binary offsets count bytes, so the response's end offset and length are
    known before anything is read; the next chunk is read (off the loop)
    while the previous one is being sent. Committed bytes never change, so
    streaming them is as consistent as one read. The first chunk is read
    before the status is sent: a read that retention overtook is then a 410,
    or, from the start (``from_start``), a read from the new start
    (``live_reads.read_from``), not a response cut short.
    """

    def promised(start: int) -> tuple[int, Headers, bool]:
        stop = min(s.tail, start + ctx.settings.max_read_bytes)
        whole = ReadResult([], start, stop, s.tail, s.meta.closed and stop >= s.tail)
        return stop, *read_headers(ctx, s, whole, h, etag=True)

    stop, hs, not_modified = promised(unit)
    if not_modified:  # nothing read
        await respond(send, 304, hs)
        return
    first = await live_reads.read_from(ctx, s, unit, from_start=from_start)
    if first.start != unit:  # retention moved the start under a read from -1: a 200 of it
        unit = first.start
        stop, hs, _ = promised(unit)
    hs = [*COMMON, *hs, (CONTENT_LENGTH.raw, str(stop - unit).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": hs})
    cur = unit
    pending: asyncio.Future[ReadResult] = asyncio.get_running_loop().create_future()
    pending.set_result(first)
    try:
        while cur < stop:
            chunk = await pending
            ctx.observe_read(chunk)
            if chunk.next <= cur:
                raise ConnectionAbortedError(f"stream {s.path} ended early mid-response")
            cur = chunk.next
            if cur < stop:
                pending = asyncio.ensure_future(
                    ctx.store.read(s, cur, min(READ_CHUNK_BYTES, stop - cur))
                )
            body = b"".join(chunk.payloads)
            await send({"type": "http.response.body", "body": body, "more_body": cur < stop})
    except StreamError as exc:
        # The status is already sent: all that is left is to cut the response short.
        log.warning("catch-up of %s cut short: %s", s.path, exc)
        raise ConnectionAbortedError(str(exc)) from None
    finally:
        pending.cancel()
