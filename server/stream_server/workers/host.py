"""The writer's side of the links: every worker's store calls, run on the one store.

A worker parses, validates and admits a request, then asks the writer for what only
the writer has: the stream's committed state, its data, a wait at its tail, or a
write through group commit. Each call is a message ``(id, op, args)``; the answer is
``(id, True, value)`` or ``(id, False, error)``. Before any call the writer gives the
refusal it would give its own request (recovery not finished, a standby's or the
archive's refusal of a write), so a worker refuses exactly what a single process
refuses.

Streams cross the link as snapshots (``Snapshot``): path, committed configuration,
tail and the earliest readable unit. A worker's stream object is updated from the
answer to each wait, which is when a single process would see its object change.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from stream_format.media import JSON_TYPE, media_type
from stream_format.meta import StreamMeta, TailValue
from stream_format.records import Producer
from stream_server.engine import BatchStats
from stream_server.protocol.live import ReaderSlots
from stream_server.protocol.refusal import Refusal
from stream_server.protocol.refusals import Decided
from stream_server.ratelimit import RateLimiter
from stream_server.streams.errors import NotFound, StreamError
from stream_server.streams.forks import chain
from stream_server.streams.model import Stream
from stream_server.streams.requests import AppendRequest, AppendResult, CreateRequest
from stream_server.streams.store import AppendItem, StreamStore
from stream_server.workers.link import Link, encode_error

log = logging.getLogger("stream_server.workers")

# One piece of a stream's log for a worker's own read (``local_reads.py``): the owning
# stream's id, record kind, units [lo, hi) (hi None: up to the stream's tail), its engine
# tail (file length, unit, base, start, start position) and whether its log is inline.
Piece = tuple[int, int, int, int | None, TailValue | None, bool]
# What a worker is told of a stream: path, configuration, tail, earliest unit, and the
# pieces a read of it covers, oldest fork source first.
Snapshot = tuple[str, StreamMeta, int, int, list[Piece]]
# Before a call: the refusal of the writer's own request of that kind, if any.
Gate = Callable[[bool], Awaitable[Refusal | None]]

WRITES = frozenset({"append", "create", "delete"})
# The most a wait's answer carries: what one commit typically brings a live reader. A
# larger wake is read by the worker itself, so a thousand readers of a stream that took
# a large append do not have it copied into a thousand answers by the serial writer.
WAIT_DATA_MAX = 64 * 1024
# A wait's answer: woken, the stream's configuration, tail, whether it is still the
# stream at its path, and what woke it when that was in memory: the unit after it,
# and its payloads.
WaitAnswer = tuple[bool, StreamMeta, int, bool, tuple[int, list[bytes]] | None]
# A batch's figures (``BatchStats``) as plain values: one tuple per batch, which each
# answer of a frame names (pickle writes it once).
BatchFigures = tuple[int, int, float, float, float, int]
# An append's answer as plain values (a tuple pickles faster than a dataclass): tail,
# closed, duplicate, producer, appended, the batch's figures, and the term it is
# acknowledged under (a duplicate's has no batch, but a term all the same).
AppendAnswer = tuple[int, bool, bool, Producer | None, bool, BatchFigures | None, int]


def snapshot(store: StreamStore, s: Stream) -> Snapshot:
    engine = store.engine
    pieces: list[Piece] = []
    for owner, lo, hi in chain(store.table, s, s.tail):
        tail = engine.tails.get(owner.id)
        pieces.append(
            (
                owner.id,
                owner.kind,
                lo,
                None if owner is s else hi,
                tail.value() if tail is not None else None,
                owner.id in engine.segments.inline,
            )
        )
    return s.path, s.meta, s.tail, store.earliest(s), pieces


class WriterHost:
    """Listens on the writer's link socket and serves each worker connected to it.

    ``gate`` gives the writer's refusal of a call, if any; ``clear`` says, without a
    coroutine, that there is none to ask for (the start's recovery finished and nothing
    refuses writes): then a call goes straight to the store. ``reads_clear`` says a
    worker may serve a catch-up read itself (``reads_open``)."""

    def __init__(
        self,
        store: StreamStore,
        gate: Gate,
        clear: Callable[[], bool],
        reads_clear: Callable[[], bool],
        limiter: RateLimiter | None = None,
        slots: ReaderSlots | None = None,
    ) -> None:
        self.store = store
        self.gate = gate
        self.clear = clear
        self.reads_clear = reads_clear  # a worker may serve a catch-up read itself now
        # The one rate limiter and the one set of live readers' slots of the pod: a
        # client's limits hold whichever worker serves it (``linked_limits.py``).
        self.limiter = limiter
        self.slots = slots
        self.server: asyncio.AbstractServer | None = None
        self.links: set[HostLink] = set()

    async def start(self, path: Path) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(lambda: HostLink(self), str(path))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for link in list(self.links):
            link.close()


class HostLink(Link):
    """One worker's connection: its calls in flight, and its waits to cancel."""

    def __init__(self, host: WriterHost) -> None:
        super().__init__(self.received, self.lost)
        self.host = host
        self.store = host.store
        self.tasks: set[asyncio.Task[None]] = set()
        self.waits: dict[int, asyncio.Future[None]] = {}
        self.held: dict[int, contextlib.AbstractContextManager[None]] = {}  # slots, by call
        # The last batch an answer named, and its figures as sent: made once per batch.
        self._batch: BatchStats | None = None
        self._figures: BatchFigures | None = None
        host.links.add(self)

    def received(self, messages: list[Any]) -> None:
        clear = self.host.clear()
        appends: list[tuple[int, tuple[Any, ...]]] = []  # taken together (``append_now``)
        for rid, op, args in messages:
            if op == "append" and clear:
                appends.append((rid, args))
                continue
            if appends:  # in order with what follows them
                self.append_now(appends)
                appends = []
            if op == "cancel":
                until = self.waits.pop(args, None)
                if until is not None and not until.done():
                    until.set_result(None)
                continue
            if op == "release":
                slot = self.held.pop(args, None)
                if slot is not None:
                    slot.__exit__(None, None, None)
                continue
            if op in AT_ONCE:  # in order with a release that follows: no task between
                self.answer_now(rid, op, args)
                continue
            self.spawn(rid, op, args)
        if appends:
            self.append_now(appends)

    def spawn(self, rid: int, op: str, args: tuple[Any, ...]) -> None:
        task = asyncio.ensure_future(self.answer(rid, op, args))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def lost(self) -> None:
        """A worker went (stopped, or killed): its waits end; its writes in flight still
        commit, and their answers have nobody to go to, as with a client that hung up."""
        self.host.links.discard(self)
        for until in self.waits.values():
            if not until.done():
                until.set_result(None)
        self.waits.clear()
        for slot in self.held.values():
            slot.__exit__(None, None, None)
        self.held.clear()

    async def answer(self, rid: int, op: str, args: tuple[Any, ...]) -> None:
        try:
            if not self.host.clear():
                refusal = await self.host.gate(op in WRITES)
                if refusal is not None:
                    raise Decided(refusal.status, refusal.headers, refusal.body)
            value = await OPS[op](self, rid, *args)
        except StreamError as exc:
            self.send((rid, False, encode_error(exc)))
        except Exception as exc:
            self.failed(rid, op, exc)
        else:
            self.send((rid, True, value))

    def append_now(self, appends: list[tuple[int, tuple[Any, ...]]]) -> None:
        """A frame's appends checked and queued in this turn as one group, each answered
        when it is durable (``StreamStore.append_many``): the writer's serial cost per
        append is what bounds the pod. A JSON body comes split by the worker; one it
        could not split takes the task's way (split here first), so that its refusal
        comes in the protocol's order."""
        items: list[AppendItem] = []
        rids: list[int] = []
        for rid, args in appends:
            path, content_type, body, stream_seq, producer, close, parsed = args
            media = media_type(content_type) if content_type is not None else None
            if body and parsed is None and media == JSON_TYPE:
                self.spawn(rid, "append", args)
                continue
            req = AppendRequest(path, content_type, body, stream_seq, producer, close)
            items.append((req, media, parsed))
            rids.append(rid)
        if items:
            self.store.append_many(items, functools.partial(self.appended, rids))

    def appended(self, rids: list[int], i: int, outcome: AppendResult | BaseException) -> None:
        rid = rids[i]
        if isinstance(outcome, AppendResult):
            batch = outcome.batch
            if batch is not self._batch:  # the group's appends share one batch's figures
                self._batch, self._figures = batch, batch_figures(batch)
            self.send((rid, True, append_answer(outcome, self._figures)))
        elif isinstance(outcome, StreamError):
            self.send((rid, False, encode_error(outcome)))
        else:
            self.failed(rid, "append", outcome)

    def failed(self, rid: int, op: str, exc: BaseException) -> None:
        """The worker answers 500, as the writer's own route would."""
        log.error("a worker's %s failed", op, exc_info=exc)
        self.send((rid, False, encode_error(StreamError(f"internal error: {exc}"))))

    def answer_now(self, rid: int, op: str, args: tuple[Any, ...]) -> None:
        """A call answered without waiting (limits): never refused by the gate, as a
        single process admits a request before it looks at the store."""
        try:
            value = AT_ONCE[op](self, rid, *args)
        except StreamError as exc:
            self.send((rid, False, encode_error(exc)))
        else:
            self.send((rid, True, value))

    def _stream(self, path: str, sid: int) -> Stream:
        """The stream a worker holds, by path: gone when another stream took the path."""
        s = self.store.table.get(path)
        if s is None or s.id != sid:
            raise NotFound("stream not found (deleted)")
        return s

    async def open(self, rid: int, path: str, touch: bool) -> Snapshot:
        return snapshot(self.store, self.store.get(path, touch=touch))

    async def wait(
        self, rid: int, path: str, sid: int, unit: int, seconds: float, most: int
    ) -> WaitAnswer:
        """Wait at the stream's tail; the answer carries what woke it when the stream's
        recent window holds it (up to ``most`` bytes), so the woken reader needs no read
        of its own, as a single process serves a woken reader from memory."""
        s = self._stream(path, sid)
        until = self.waits[rid] = asyncio.get_running_loop().create_future()
        try:
            deadline = asyncio.get_running_loop().time() + seconds
            woken = await self.store.wait(s, unit, deadline, until)
        finally:
            self.waits.pop(rid, None)
        ready = self.store.reader.from_memory(s, unit, min(most, WAIT_DATA_MAX)) if woken else None
        data = None
        if ready is not None and ready.next == s.tail:  # all of it, or the worker reads
            data = ready.next, [bytes(p) for p in ready.payloads]
        return woken, s.meta, s.tail, self.store.is_current(s), data

    async def append(
        self,
        rid: int,
        path: str,
        content_type: str | None,
        body: bytes,
        stream_seq: str | None,
        producer: Producer | None,
        close: bool,
        parsed: list[bytes] | None,
    ) -> AppendAnswer:
        """The way of an append that must wait first (a gate, a JSON body to split)."""
        req = AppendRequest(path, content_type, body, stream_seq, producer, close)
        result = await self.store.append(req)
        return append_answer(result, batch_figures(result.batch))

    async def create(self, rid: int, req: CreateRequest) -> tuple[Snapshot, bool, int, bool]:
        result = await self.store.create(req)
        return snapshot(self.store, result.stream), result.created, result.tail, result.closed

    async def delete(self, rid: int, path: str) -> None:
        await self.store.delete(path)

    def writes_open(self, rid: int) -> bool:
        """Whether a write would be taken at once (``WorkerApp._here``): else the worker
        relays it, and the writer refuses it, or waits, as a single process does."""
        return self.host.clear()

    def reads_open(self, rid: int) -> bool:
        """Whether a worker may serve a catch-up read itself (``WorkerApp._here``): the
        stream it then opens is taken after this answer, so it holds all this replica
        held when it was current; else the worker relays the read to be refused here."""
        return self.host.reads_clear()

    def admit(self, rid: int, client: str) -> float:
        limiter = self.host.limiter
        return 0.0 if limiter is None else limiter.acquire(client)

    def hold(self, rid: int, mode: str, client: str) -> None:
        """Take a live reader's slot until the worker sends ``release`` for this call
        (or its link goes): 503 or 429 as a single process refuses one."""
        assert self.host.slots is not None
        slot = self.host.slots.hold(mode, client)
        slot.__enter__()
        self.held[rid] = slot


def batch_figures(batch: BatchStats | None) -> BatchFigures | None:
    if batch is None:
        return None
    return (
        batch.appends,
        batch.bytes,
        batch.write_seconds,
        batch.fsync_seconds,
        batch.commit_seconds,
        batch.term,
    )


def append_answer(r: AppendResult, figures: BatchFigures | None) -> AppendAnswer:
    return r.tail, r.closed, r.duplicate, r.producer, r.appended, figures, r.term


OPS: dict[str, Callable[..., Awaitable[Any]]] = {
    "open": HostLink.open,
    "wait": HostLink.wait,
    "append": HostLink.append,
    "create": HostLink.create,
    "delete": HostLink.delete,
}
# Calls answered in the turn they arrive in, in order with the messages around them: a
# hold's release may come in the same frame (a reader that hung up at once).
AT_ONCE: dict[str, Callable[..., Any]] = {
    "admit": HostLink.admit,
    "hold": HostLink.hold,
    "writes_open": HostLink.writes_open,
    "reads_open": HostLink.reads_open,
}
