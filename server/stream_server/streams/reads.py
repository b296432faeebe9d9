"""Catch-up reads: committed units of a stream, stitched across its fork sources.

Log reads run on a small thread pool of their own, so disk reads never block
the event loop and never queue behind the commit pipeline. A read sees the
committed tail as it was when the read began; a live reader just woken by a
commit is served from the stream's recent window without touching the disk.
A read below the retained start (``retention.py``) is refused (410).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from stream_server.engine import DamagedStream, Engine, HeadDropped
from stream_server.streams.errors import Damaged, OffsetGone
from stream_server.streams.forks import Piece, chain
from stream_server.streams.model import Stream
from stream_server.streams.pending import StreamTable
from stream_server.streams.requests import ReadResult
from stream_server.streams.retention import earliest

Got = tuple[list[memoryview], int]  # payloads read, and the unit just after them
P = TypeVar("P")


async def stitched(
    pieces: Iterable[P],
    bounds: Callable[[P], tuple[int, int]],
    start: int,
    max_bytes: int,
    read_one: Callable[[P, int, int, int], Awaitable[Got]],
) -> tuple[list[bytes | memoryview], int]:
    """A read from ``start`` across a stream's pieces (its fork sources' logs, then its
    own), each piece's units ``bounds(piece)`` read by ``read_one(piece, from, to,
    budget)``: the payloads, at most about ``max_bytes``, and the unit after them. Also
    a worker process's local read (``workers/local_reads.py``). A damaged log is
    refused (500) and never served short."""
    payloads: list[bytes | memoryview] = []
    cur, budget = start, max_bytes
    for piece in pieces:
        lo, hi = bounds(piece)
        if cur >= hi:
            continue
        if budget <= 0:
            break
        cur = max(cur, lo)
        try:
            got, nxt = await read_one(piece, cur, hi, budget)
        except DamagedStream as exc:
            raise Damaged(f"stream data failed its checksum and is not served: {exc}") from None
        payloads += got
        budget -= sum(map(len, got))
        cur = nxt
        if cur < hi:
            break
    return payloads, cur


class Reader:
    def __init__(self, engine: Engine, table: StreamTable, threads: int) -> None:
        self._engine = engine
        self._table = table
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="reader")

    async def read(self, s: Stream, start: int, max_bytes: int) -> ReadResult:
        """Committed data from ``start``, at most about ``max_bytes`` of it; OffsetGone
        (410) below the retained start, also when retention overtakes the read."""
        first = earliest(self._table, self._engine, s)
        if start < first:
            raise OffsetGone(first)
        tail = s.tail
        closed = s.meta.closed
        if start >= tail:
            return ReadResult([], start, start, tail, closed)
        window = s.recent
        recent = (
            window.serve(start, tail, max_bytes, kind=s.kind, fork_offset=s.meta.fork_offset)
            if window is not None
            else None
        )
        if recent is not None:
            served, nxt = recent
            return ReadResult(served, start, nxt, tail, closed and nxt >= tail)
        loop = asyncio.get_running_loop()

        async def read_one(piece: Piece, cur: int, hi: int, budget: int) -> Got:
            owner = piece.owner
            got, nxt, hint = await loop.run_in_executor(
                self._pool,
                self._engine.read,
                owner.id,
                owner.kind,
                cur,
                hi,
                budget,
                owner.read_hint,
            )
            owner.read_hint = hint
            return got, nxt

        pieces = chain(self._table, s, tail)
        try:
            payloads, cur = await stitched(
                pieces, lambda p: (p.lo, p.hi), start, max_bytes, read_one
            )
        except HeadDropped:
            raise OffsetGone(earliest(self._table, self._engine, s)) from None
        return ReadResult(payloads, start, cur, tail, closed and cur >= tail)

    async def record_end(self, stream_id: int, unit: int) -> int:
        """The end unit of the record holding ``unit``, read off the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._engine.record_end, stream_id, unit)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
