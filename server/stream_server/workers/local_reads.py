"""A worker's catch-up reads, from the data directory itself: no bytes through the writer.

The writer says what a stream is when a worker opens it (``host.snapshot``): its
committed tail, and the pieces of log a read covers (its own and its fork sources',
each with the engine's tail and whether the log is inline in LMDB). The worker then
reads those pieces by the engine's own reader (``engine.log_reads.LogReads``:
positional reads of the segment files and LMDB's inline values in a read
transaction, checksums checked), never past that committed tail: what lies below it is durable and is never
rewritten, which is what makes the read safe from another process, as the Spark
reader's is.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from stream_format.layout import Layout
from stream_server.engine.batch import Tail
from stream_server.engine.log_reads import LogReads
from stream_server.engine.metadata import Metadata
from stream_server.engine.segments import Segments
from stream_server.engine.storage_errors import HeadDropped
from stream_server.streams.errors import Damaged, OffsetGone
from stream_server.streams.reads import Got, stitched
from stream_server.streams.requests import ReadResult
from stream_server.workers.host import Piece

THREADS = 4  # positional reads in flight at once, as the writer's own reader pool


class ReadOnlyLog:
    """The engine's reader (``LogReads``) over the data directory, with LMDB opened for
    reading only, fed the tails the writer names."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.segments = Segments(layout)
        # The tails the writer named may be older than a drop that overtook a read:
        # the reader then asks LMDB for the retained start as it is now.
        self.reads = LogReads(self.segments, starts_in_lmdb=True)
        self.owned = True  # the environment is this object's to close

    def opened(self) -> LogReads:
        """The reader, LMDB opened on first use: the writer creates it during its start's
        recovery, and a worker reads nothing before the writer has answered an ``open``."""
        if self.segments.meta is None:
            self.segments.meta = Metadata.read_only(self.layout.meta)
        return self.reads

    def share(self, meta: Metadata) -> None:
        """Read through an environment this process has open already: LMDB allows one per
        path and process (the in-process test kit runs a worker beside its writer)."""
        self.segments.meta = meta
        self.owned = False

    def take(self, piece: Piece) -> None:
        """What the writer said of one piece's stream, for the read that follows."""
        sid, _, _, _, tail, inline = piece
        if tail is not None:
            self.reads.tails[sid] = Tail(
                tail.file_len, tail.unit, tail.base, tail.start, tail.start_pos
            )
        if inline:
            self.segments.inline.add(sid)
        else:
            self.segments.inline.discard(sid)

    def close(self) -> None:
        if self.segments.meta is not None and self.owned:
            self.segments.meta.env.close()


class LocalReads:
    """Reads of the pieces a snapshot named, on a small pool of threads."""

    def __init__(self, layout: Layout) -> None:
        self.log = ReadOnlyLog(layout)
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="reader")

    async def read(
        self,
        pieces: list[Piece],
        tail: int,
        closed: bool,
        first: int,
        start: int,
        max_bytes: int,
    ) -> ReadResult:
        """Committed data of a stream from ``start`` up to ``tail``, at most about
        ``max_bytes``, as ``streams.reads.Reader.read`` serves it."""
        if start < first:
            raise OffsetGone(first)
        if start >= tail:
            return ReadResult([], start, start, tail, closed)
        reads = self.log.opened()
        loop = asyncio.get_running_loop()

        async def read_one(piece: Piece, cur: int, hi: int, budget: int) -> Got:
            self.log.take(piece)
            got, nxt, _ = await loop.run_in_executor(
                self.pool, reads.read, piece[0], piece[1], cur, hi, budget, None
            )
            return got, nxt

        def bounds(piece: Piece) -> tuple[int, int]:
            return piece[2], tail if piece[3] is None else piece[3]

        try:
            payloads, cur = await stitched(pieces, bounds, start, max_bytes, read_one)
        except HeadDropped as exc:
            raise OffsetGone(exc.start) from None
        except Damaged:
            # A worker never remembers a stream as damaged: its view may be older than
            # a drop, and the writer, which reads every log itself, is the one that knows.
            reads.forget_damage()
            raise
        return ReadResult(payloads, start, cur, tail, closed and cur >= tail)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.log.close()
