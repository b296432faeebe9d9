"""A worker's store: the protocol layer's operations, asked of the writer over the link.

``LinkedStore`` implements ``ProtocolStore``, so the worker runs the same protocol
handlers as a single process (parsing, validation, admission, responses) and only
the store's work crosses to the writer (``host.py`` answers). A stream here is a
``LinkedStream``: the writer's snapshot, updated by each wait's answer.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_format.media import JSON_TYPE, media_type
from stream_server.engine import BatchStats
from stream_server.protocol.context import READ_CHUNK_BYTES
from stream_server.streams.errors import StreamError, Unavailable
from stream_server.streams.interface import ProtocolStore
from stream_server.streams.jsonmode import INLINE_MAX_BYTES, split_fast
from stream_server.streams.model import Stream
from stream_server.streams.requests import (
    AppendRequest,
    AppendResult,
    CreateRequest,
    CreateResult,
    ReadResult,
)
from stream_server.workers.host import AppendAnswer, Snapshot
from stream_server.workers.link import Link, decode_error
from stream_server.workers.local_reads import LocalReads
from stream_server.workers.shared_waits import SharedWait, WaitKey


class WriterLost(Exception):
    """The writer went while a call was in flight: whether it was carried out is not
    known, so the request gets no answer (its connection is reset, as a crashed single
    process would leave it), never a refusal that would say nothing changed."""


class LinkedStream(Stream):
    """A stream as the writer last described it."""

    __slots__ = ("current", "first", "pieces", "ready")

    def __init__(self, snap: Snapshot) -> None:
        path, meta, tail, first, pieces = snap
        super().__init__(path, meta, tail, committed=True)
        self.first = first  # the earliest unit a read may ask for
        self.current = True  # still the stream at its path, as of the last answer
        self.pieces = pieces  # what a read of it covers (``local_reads``)
        # What the last wait's answer brought from ``unit``: (unit, next, payloads).
        self.ready: tuple[int, int, list[bytes]] | None = None


class LinkedStore:
    """``ProtocolStore`` over a link to the writer; ``on_lost`` is told when it breaks."""

    def __init__(self, on_lost: Callable[[], None], local: LocalReads, max_messages: int) -> None:
        self.on_lost = on_lost
        self.local = local  # catch-up reads from the data directory
        self.read_chunk = READ_CHUNK_BYTES  # the most a live read sends at once (``Context``'s)
        self.max_messages = max_messages  # --max-json-messages
        self.link: Link | None = None
        self.calls: dict[int, asyncio.Future[Any]] = {}
        # The writer's waits in flight that readers may still join, by what they wait for.
        self.shared: dict[WaitKey, SharedWait] = {}
        self.ids = itertools.count(1)
        self.stopping = False

    async def connect(self, path: Path) -> None:
        loop = asyncio.get_running_loop()
        _, link = await loop.create_unix_connection(
            lambda: Link(self._answered, self._lost), str(path)
        )
        self.link = link

    def close(self) -> None:
        if self.link is not None:
            self.link.close()

    def _call(self, op: str, *args: Any) -> tuple[int, asyncio.Future[Any]]:
        if self.link is None or self.link.transport is None:
            raise Unavailable("the writer process is not reachable")  # nothing sent: 503
        rid = next(self.ids)
        future = self.calls[rid] = asyncio.get_running_loop().create_future()
        self.link.send((rid, op, args))
        return rid, future

    def _answered(self, messages: list[Any]) -> None:
        calls = self.calls
        for rid, ok, value in messages:
            future = calls.pop(rid, None)
            if future is None or future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(decode_error(value))

    def _lost(self) -> None:
        self.link = None  # later calls: 503, nothing was sent
        calls, self.calls = self.calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(WriterLost("the writer process went away"))
        self.on_lost()

    async def open(self, path: str, *, touch: bool = False) -> Stream:
        return LinkedStream(await self._call("open", path, touch)[1])

    def earliest(self, s: Stream) -> int:
        assert isinstance(s, LinkedStream)
        return s.first

    def is_current(self, s: Stream) -> bool:
        assert isinstance(s, LinkedStream)
        return s.current

    async def create(self, req: CreateRequest) -> CreateResult:
        snap, created, tail, closed = await self._call("create", req)[1]
        return CreateResult(LinkedStream(snap), created, tail, closed)

    async def append(self, req: AppendRequest) -> AppendResult:
        answer: AppendAnswer = await self._call(
            "append",
            req.path,
            req.content_type,
            req.body,
            req.stream_seq,
            req.producer,
            req.close,
            self._split(req),
        )[1]
        tail, closed, duplicate, producer, appended, stats, term = answer
        batch = None if stats is None else BatchStats(*stats)
        return AppendResult(tail, closed, duplicate, producer, appended, batch, term)

    def _split(self, req: AppendRequest) -> list[bytes] | None:
        """A JSON body's messages, split here rather than by the serial writer; None when
        it is not JSON, too large to split on this loop, or not valid (the writer then
        refuses it, after the checks that come first: 404 before 400)."""
        if not req.body or len(req.body) > INLINE_MAX_BYTES or req.content_type is None:
            return None
        if media_type(req.content_type) != JSON_TYPE:
            return None
        try:
            return split_fast(req.body, allow_empty_array=False, max_messages=self.max_messages)
        except StreamError:
            return None

    async def delete(self, path: str) -> None:
        await self._call("delete", path)[1]

    async def read(self, s: Stream, start: int, max_bytes: int) -> ReadResult:
        """From the data directory itself (``local_reads``), never through the writer."""
        assert isinstance(s, LinkedStream)
        ready, s.ready = s.ready, None
        if ready is not None and ready[0] == start:
            _, nxt, payloads = ready
            if sum(map(len, payloads)) <= max_bytes:
                served: list[bytes | memoryview] = list(payloads)
                return ReadResult(served, start, nxt, s.tail, s.meta.closed and nxt >= s.tail)
        return await self.local.read(s.pieces, s.tail, s.meta.closed, s.first, start, max_bytes)

    async def wait(
        self, s: Stream, unit: int, deadline: float, until: asyncio.Future[Any] | None = None
    ) -> bool:
        """The writer's wait at ``s``'s tail; ``until`` resolving (the reader hung up)
        or the worker stopping ends it. Readers of this worker at the same stream and
        unit share one wait at the writer (``SharedWait``): a stream's fan-out costs the
        serial writer one answer per worker, not one per reader."""
        assert isinstance(s, LinkedStream)
        loop = asyncio.get_running_loop()
        while True:
            if s.tail > unit or s.meta.closed:
                return True
            seconds = deadline - loop.time()
            if self.stopping or seconds <= 0 or (until is not None and until.done()):
                return False
            shared = self._shared((s.path, s.id, unit), seconds, deadline)
            got = await shared.join(until)
            if got is None:  # this reader hung up
                return False
            woken, s.meta, s.tail, s.current, data = got
            if data is not None:
                s.ready = (unit, data[0], data[1])
            if woken or shared.deadline >= deadline:
                return bool(woken)
            # It ended at an earlier reader's deadline: wait on for the rest of this one's.

    def _shared(self, key: WaitKey, seconds: float, deadline: float) -> SharedWait:
        """The wait at the writer for ``key``'s stream and unit: the one under way, or a
        new one."""
        shared = self.shared.get(key)
        if shared is None:
            rid, answer = self._call("wait", *key, seconds, self.read_chunk)
            shared = self.shared[key] = SharedWait(key, rid, deadline, self._left)
            answer.add_done_callback(functools.partial(self._wait_ended, shared))
        return shared

    def _wait_ended(self, shared: SharedWait, answer: asyncio.Future[Any]) -> None:
        if self.shared.get(shared.key) is shared:
            del self.shared[shared.key]
        shared.answered(answer)

    def _left(self, shared: SharedWait) -> None:
        """Its last reader left before the writer answered: the writer ends it."""
        if self.shared.get(shared.key) is shared:
            del self.shared[shared.key]
            self._cancel(shared.rid)

    async def call(self, op: str, *args: Any) -> Any:
        """Any other call of the writer (``linked_limits.py``)."""
        return await self._call(op, *args)[1]

    async def hold(self, mode: str, client: str) -> int:
        """Take one of the writer's live readers' slots; the call's id releases it."""
        rid, answer = self._call("hold", mode, client)
        try:
            await answer
        except asyncio.CancelledError:  # the writer took it (or will): give it back
            self.release(rid)
            raise
        return rid

    def release(self, rid: int) -> None:
        if self.link is not None:
            self.link.send((0, "release", rid))

    def _cancel(self, rid: int) -> None:
        if self.link is not None:
            self.link.send((0, "cancel", rid))

    def release_waiters(self) -> None:
        """End every wait as on its timeout, and later ones at once (the worker stops)."""
        self.stopping = True
        for shared in self.shared.values():  # each leaves when the writer answers
            self._cancel(shared.rid)


if TYPE_CHECKING:  # mypy checks that a worker's store offers what the protocol layer asks

    def _implements(store: LinkedStore) -> ProtocolStore:
        return store
