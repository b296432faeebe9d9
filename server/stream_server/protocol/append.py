"""POST: append to a stream, close it, or both, with or without an idempotent producer.

The store applies the rules (closed, content type, Stream-Seq, producer
epoch and sequence); this module reads the request, reports the outcome in
the protocol's headers, and times the append. A producer's append answers
200 when it appended and 204 when it was a duplicate already acknowledged;
an append without a producer answers 204. Slow appends are logged with the
split of their group commit (write, fsync, metadata commit), so an operator
can tell a slow disk from a slow LMDB.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from stream_format.offsets import format_offset
from stream_server.protocol.context import TRUE, Context, content_type
from stream_server.protocol.headers import (
    PRODUCER_EPOCH,
    PRODUCER_ID,
    PRODUCER_SEQ,
    REPLICATION_TERM,
    STREAM_CLOSED,
    STREAM_NEXT_OFFSET,
    STREAM_SEQ,
    is_true,
    parse_producer,
)
from stream_server.protocol.http import Headers, Receive, Scope, Send, respond
from stream_server.streams.requests import AppendRequest

if TYPE_CHECKING:
    from stream_server.engine import BatchStats

log = logging.getLogger("stream_server.protocol")


async def post(
    ctx: Context,
    scope: Scope,
    receive: Receive,
    send: Send,
    path: str,
    h: dict[str, str],
    client: str,
) -> None:
    started = time.perf_counter()
    producer = parse_producer(
        h.get(PRODUCER_ID.key), h.get(PRODUCER_EPOCH.key), h.get(PRODUCER_SEQ.key)
    )
    seq = h.get(STREAM_SEQ.key)
    body = await ctx.read_body(receive, h)
    result = await ctx.store.append(
        AppendRequest(
            path=path,
            content_type=content_type(h),
            body=body,
            stream_seq=seq,
            producer=producer,
            close=is_true(h.get(STREAM_CLOSED.key)),
        )
    )
    if result.appended or result.batch is not None:
        _observe_append(ctx, path, started, result.batch)
    hs: Headers = [(STREAM_NEXT_OFFSET.raw, format_offset(result.tail).encode())]
    if result.closed:
        hs.append((STREAM_CLOSED.raw, TRUE))
    if result.term:  # a duplicate's answer too: every acknowledgement of a primary
        hs.append((REPLICATION_TERM.raw, str(result.term).encode()))
    status = 204
    if result.producer is not None:
        hs.append((PRODUCER_EPOCH.raw, str(result.producer.epoch).encode()))
        hs.append((PRODUCER_SEQ.raw, str(result.producer.seq).encode()))
        status = 200 if result.appended else 204
    await respond(send, status, hs)


def _observe_append(ctx: Context, path: str, started: float, batch: BatchStats | None) -> None:
    elapsed = time.perf_counter() - started
    if ctx.metrics is not None:
        ctx.metrics.append_seconds.observe(elapsed)
    if elapsed >= ctx.settings.slow_append_seconds:
        split = {
            "seconds": round(elapsed, 6),
            "write_seconds": round(batch.write_seconds, 6) if batch else None,
            "fsync_seconds": round(batch.fsync_seconds, 6) if batch else None,
            "commit_seconds": round(batch.commit_seconds, 6) if batch else None,
            "batch_appends": batch.appends if batch else None,
        }
        if ctx.metrics is not None:
            ctx.metrics.slow_appends.inc()
        log.warning(
            "slow append to %s: %.3fs (write %ss, fsync %ss, commit %ss)",
            path,
            elapsed,
            split["write_seconds"],
            split["fsync_seconds"],
            split["commit_seconds"],
            extra={"fields": {"event": "slow_append", "stream": path, **split}},
        )
