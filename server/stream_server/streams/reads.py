"""Catch-up reads: committed units of a stream, stitched across its fork sources.

Log reads run on a small thread pool of their own, so disk reads never block
the event loop and never queue behind the commit pipeline. A read sees the
committed tail as it was when the read began; a live reader just woken by a
commit is served from the stream's recent window without touching the disk.
A read below the retained start (``retention.py``) is refused (410).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from stream_server.engine import DamagedStream, Engine, HeadDropped
from stream_server.streams.errors import Damaged, OffsetGone
from stream_server.streams.forks import chain
from stream_server.streams.model import Stream
from stream_server.streams.pending import StreamTable
from stream_server.streams.requests import ReadResult
from stream_server.streams.retention import earliest


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
        payloads: list[bytes | memoryview] = []
        cur = start
        budget = max_bytes
        for owner, lo, hi in chain(self._table, s, tail):
            if cur >= hi:
                continue
            if budget <= 0:
                break
            cur = max(cur, lo)
            try:
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
            except HeadDropped:
                raise OffsetGone(earliest(self._table, self._engine, s)) from None
            except DamagedStream as exc:
                raise Damaged(f"stream data failed its checksum and is not served: {exc}") from None
            owner.read_hint = hint
            payloads += got
            budget -= sum(map(len, got))
            cur = nxt
            if cur < hi:
                break
        return ReadResult(payloads, start, cur, tail, closed and cur >= tail)

    async def record_end(self, stream_id: int, unit: int) -> int:
        """The end unit of the record holding ``unit``, read off the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._engine.record_end, stream_id, unit)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
