"""Live reads: long-poll and SSE, which wait at the tail for the next commit.

Both are woken by the store's commit events (``store.wait``), never by a
timer, and both also listen to the client hanging up (``live.Hangup``), so
a waiter that nobody will read from stops at once. A long-poll answers once:
with data, or 204 when its timeout passes with nothing new. An SSE response
stays open, sending a data event and a control event (next offset, cursor,
up-to-date, closed) per read, until the stream closes, is deleted, or the
reconnect interval passes at the tail (then the client reconnects with the
last cursor it was sent). The slots and the hangup machinery live in
``live``; this module is the reading.

On a replica set's member (``ctx.read_gate``) a live read's wait also ends
when the replica stops being current within its staleness bound (an event,
``ReadGate.stale``), and it looks again whenever it wakes: a long-poll on a
replica that fell behind (its primary paused, a partition) is then answered
503 as a new read would be, and an SSE response ends (as at its reconnect
interval), so that the client reconnects and hears the 503. Neither ever says up to date from a tail it cannot vouch for.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import orjson

from stream_format.offsets import format_offset
from stream_server.protocol import sse as sse_format
from stream_server.protocol.context import CACHE_NONE, TRUE, Context
from stream_server.protocol.cursor import next_cursor
from stream_server.protocol.headers import (
    CACHE_CONTROL,
    CONTENT_TYPE,
    STREAM_CLOSED,
    STREAM_CURSOR,
    STREAM_NEXT_OFFSET,
    STREAM_SSE_DATA_ENCODING,
    STREAM_UP_TO_DATE,
    X_ACCEL_BUFFERING,
)
from stream_server.protocol.http import COMMON, Headers, Send, respond
from stream_server.protocol.live import Hangup
from stream_server.protocol.read_response import json_array, send_read
from stream_server.streams.errors import OffsetGone, StreamError
from stream_server.streams.model import Stream
from stream_server.streams.requests import ReadResult

log = logging.getLogger("stream_server.protocol")

# How often a read from the start (offset -1) that retention overtook reads again.
START_RETRIES = 3


async def read_from(ctx: Context, s: Stream, unit: int, *, from_start: bool) -> ReadResult:
    """The read from ``unit`` (catch-up, or a live read's first). One from the start
    (offset -1) that retention overtook reads again from the new start: it asked for the
    earliest retained data, which is never gone (410 is for an offset the client named).
    Retention only moves forward, and a drop is a batch of its own: a few tries are
    plenty."""
    for _ in range(START_RETRIES):
        try:
            return await ctx.store.read(s, unit, ctx.read_chunk)
        except OffsetGone:
            if not from_start:
                raise
            unit = ctx.store.earliest(s)
    return await ctx.store.read(s, unit, ctx.read_chunk)


async def long_poll(
    ctx: Context,
    send: Send,
    s: Stream,
    unit: int,
    h: dict[str, str],
    cursor: str | None,
    hangup: Hangup,
    *,
    from_start: bool = False,
) -> None:
    """``from_start``: ``unit`` is the earliest retained unit, for offset -1."""
    if s.tail <= unit and not s.meta.closed:
        deadline = asyncio.get_running_loop().time() + ctx.settings.long_poll_timeout
        await _wait(ctx, s, unit, deadline, hangup)
        if hangup.happened:
            return
        if ctx.read_gate is not None and (refusal := ctx.read_gate.read_refusal()) is not None:
            await respond(send, *refusal)
            return
        if not ctx.store.is_current(s):  # deleted, or another stream took its path
            s = await ctx.store.open(s.path)
    if s.tail <= unit:
        hs: Headers = [
            (STREAM_NEXT_OFFSET.raw, format_offset(s.tail).encode()),
            (STREAM_UP_TO_DATE.raw, TRUE),
            (CACHE_CONTROL.raw, CACHE_NONE),
        ]
        if s.meta.closed:
            hs.append((STREAM_CLOSED.raw, TRUE))
        else:
            hs.append((STREAM_CURSOR.raw, next_cursor(cursor).encode()))
        await respond(send, 204, hs)
        return
    result = await read_from(ctx, s, unit, from_start=from_start)
    ctx.observe_read(result)
    await send_read(ctx, send, s, result, h, cursor=next_cursor(cursor))


async def sse(  # noqa: C901 - one SSE connection's life in the order the protocol gives it
    ctx: Context,
    send: Send,
    s: Stream,
    unit: int,
    cursor: str | None,
    hangup: Hangup,
    *,
    from_start: bool = False,
) -> None:
    """``from_start``: ``unit`` is the earliest retained unit, for offset -1 (its first
    read only: later ones continue from what was sent)."""
    text = s.is_json or s.meta.content_type.lower().startswith("text/")
    hs: Headers = [
        (CONTENT_TYPE.raw, b"text/event-stream"),
        (CACHE_CONTROL.raw, b"no-cache"),
        (X_ACCEL_BUFFERING.raw, b"no"),
    ]
    if not text:
        hs.append((STREAM_SSE_DATA_ENCODING.raw, b"base64"))
    await send({"type": "http.response.start", "status": 200, "headers": [*COMMON, *hs]})
    deadline = asyncio.get_running_loop().time() + ctx.settings.sse_reconnect_interval
    try:
        while True:
            result = await read_from(ctx, s, unit, from_start=from_start)
            from_start = False
            if ctx.metrics is not None:
                ctx.metrics.read_bytes.inc(sum(map(len, result.payloads)))
            chunks = [_data_event(s, result.payloads, text)] if result.payloads else []
            unit = result.next
            closed = s.meta.closed and unit >= s.tail
            if not closed:
                cursor = next_cursor(cursor)
            chunks.append(_control_event(s, unit, closed, cursor))
            if ctx.read_gate is not None and ctx.read_gate.fresh_for() <= 0:
                break  # this replica fell behind: the client reconnects and hears why
            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
            if closed:
                break
            if unit < s.tail:
                continue
            if not await _more(ctx, s, unit, deadline, hangup):
                if hangup.happened:
                    return  # nobody to end the response for
                break
    except StreamError as exc:
        log.debug("SSE ended: %s", exc)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _more(ctx: Context, s: Stream, unit: int, deadline: float, hangup: Hangup) -> bool:
    """Wait at the tail for more of ``s``; False when the response ends instead: the
    reconnect interval reached, the client gone, the stream deleted meanwhile."""
    if asyncio.get_running_loop().time() >= deadline:
        return False
    await _wait(ctx, s, unit, deadline, hangup)
    if hangup.happened or not ctx.store.is_current(s):
        return False
    return s.tail > unit or s.meta.closed


def _data_event(s: Stream, payloads: list[bytes | memoryview], text: bool) -> bytes:
    """The data read, as one event: a JSON array, text lines, or base64."""
    if s.is_json:
        return sse_format.data_event_text(json_array(payloads))
    if text:
        return sse_format.data_event_text(b"".join(payloads))
    return sse_format.data_event_raw(base64.b64encode(b"".join(payloads)))


def _control_event(s: Stream, unit: int, closed: bool, cursor: str | None) -> bytes:
    """Where the reader is after a data event: next offset, and closed or its cursor."""
    control: dict[str, Any] = {"streamNextOffset": format_offset(unit)}
    if closed:
        control["streamClosed"] = True
        control["upToDate"] = True
    else:
        control["streamCursor"] = cursor
        if unit >= s.tail:
            control["upToDate"] = True
    return sse_format.control_event(orjson.dumps(control))


async def _wait(ctx: Context, s: Stream, unit: int, deadline: float, hangup: Hangup) -> None:
    """``store.wait`` for data past ``unit``; on a replica set's member it also ends the
    moment the replica stops being current (``ReadGate.stale``: one future for every
    live read, woken by one timer, not a timer per reader)."""
    gate = ctx.read_gate
    if gate is None:
        await ctx.store.wait(s, unit, deadline, hangup.future)
        return
    stale = gate.stale()
    if stale.done():
        return
    either: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def end(_: asyncio.Future[Any]) -> None:
        if not either.done():
            either.set_result(None)

    for f in (hangup.future, stale):
        f.add_done_callback(end)
    try:
        await ctx.store.wait(s, unit, deadline, either)
    finally:
        for f in (hangup.future, stale):
            f.remove_done_callback(end)
