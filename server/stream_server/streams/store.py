"""The stream store: the one place that coordinates every operation on streams.

The create and append checks stay together here, each one synchronous
check-and-reserve step that reads as a whole, while each rule it applies lives
in a module of its own (below). All validation runs on the event loop against
each stream's pending state (``pending.py``), so a request is checked and its
effect reserved in one step, with no locks; the effect
becomes visible to readers only when its batch is durable, through the commit
action each operation hands to the pipeline. A failed batch rolls every
pending change back in one place.

The rules themselves live one concern a module: idempotent producers
(``producers.py``), forks (``forks.py``), TTL and the sweeper (``expiry.py``),
retention (``retention.py``), catch-up reads (``reads.py``), live readers
(``waiting.py``) and the recent-read window (``recent.py``); what "now" is
comes from one injected clock (``clock.py``). The layers above see the store
only through the interfaces in ``interface.py`` (its operations and read-only
queries such as ``get`` and ``is_current``) and never change a stream's fields
themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_format.meta import StreamMeta
from stream_format.records import Producer
from stream_server.declared.network import LimitsSettings
from stream_server.engine import (
    BatchStats,
    Engine,
    LoadedState,
    RecoveryReport,
    StorageError,
    StorageFailed,
)
from stream_server.engine.ops import Op
from stream_server.engine.pipeline import CommitPipeline
from stream_server.engine.replica import AckGate
from stream_server.streams.appends import Reserved, publish_append, reserve_append
from stream_server.streams.clock import WALL_CLOCK, Clock
from stream_server.streams.creates import queue_create
from stream_server.streams.errors import (
    BadRequest,
    Conflict,
    Gone,
    NotFound,
    OffsetGone,
    StreamClosed,
    StreamError,
    Unavailable,
)
from stream_server.streams.expiry import Expiry, lifetime, same_lifetime
from stream_server.streams.forks import (
    fork_point,
    fork_source,
    matches_fork,
    queue_delete,
    sub_offset_boundary,
)
from stream_server.streams.interface import ProtocolStore, SubscriptionStore
from stream_server.streams.jsonmode import JsonSplitter
from stream_server.streams.keyed_values import check_space, keyed_value_op
from stream_server.streams.model import JSON_TYPE, Stream, media_type
from stream_server.streams.path_rules import MAX_PATH_BYTES
from stream_server.streams.pending import AllStreams, StreamTable
from stream_server.streams.producers import check_producer
from stream_server.streams.reads import Reader
from stream_server.streams.requests import (
    AppendRequest,
    AppendResult,
    CreateRequest,
    CreateResult,
    ForkRequest,
    ReadResult,
)
from stream_server.streams.retention import Retention, earliest
from stream_server.streams.store_options import StoreEvents, StoreLimits
from stream_server.streams.waiting import LiveReaders

log = logging.getLogger("stream_server.streams")

DEFAULT_CONTENT_TYPE = "application/octet-stream"
# One append of a group (``append_many``): the request, its media type, and its JSON
# body split ahead (None: not JSON, or not split).
AppendItem = tuple[AppendRequest, str | None, list[bytes] | None]
# Told each append's outcome by its place in the group: its result, or its refusal.
AppendReply = Callable[[int, AppendResult | BaseException], None]
# One append of a group once queued: its place, what its commit publishes, and the
# Stream-Closed and producer its result repeats.
Taken = tuple[int, Reserved, bool, Producer | None]


class StreamStore:
    def __init__(
        self,
        data_dir: Path,
        *,
        limits: StoreLimits | None = None,
        settings: LimitsSettings | None = None,
        events: StoreEvents | None = None,
        engine: Engine | None = None,
        clock: Clock = WALL_CLOCK,
        gate: AckGate | None = None,
    ) -> None:
        """``engine``: one built by the caller (its map size, fault hook, a replica set's
        hooks); ``gate``: what each batch waits for before its writers hear of it (a
        replica set's shipper, ``CommitPipeline``), none on a single node; ``settings``:
        the limits' group, of which the store reads the streams' counts, sizes and TTL."""
        self.engine = engine or Engine(data_dir)
        # What "now" is for every time-based rule (TTL, Expires-At, retention ages).
        self.clock = clock
        self.limits = limits or StoreLimits()
        self.settings = settings or LimitsSettings()
        self.events = events or StoreEvents()
        self.table = StreamTable(
            self._load, self.engine.stored_stream_count, self.settings.hot_streams
        )
        self.next_id = 1
        # A standby's streams whose engine tail is ahead of what readers may see there:
        # the tail a load takes instead (None: not visible yet). Empty on a single node.
        self.held: dict[int, int | None] = {}
        self.ready = False
        self.recovery: RecoveryReport | None = None
        # How long ``start`` took after the engine's recovery, making a ``Stream`` per
        # stream on the loop (outside ``RecoveryReport.seconds``).
        self.load_seconds = 0.0
        self.pipeline = CommitPipeline(
            self.engine, on_failure=self._on_failure, on_batch=self._on_batch, gate=gate
        )
        self.reader = Reader(self.engine, self.table, self.limits.read_threads)
        self.json = JsonSplitter(self.settings.max_json_messages)
        self.live = LiveReaders()
        self.expiry = Expiry(
            self.table,
            interval=self.limits.sweep_interval,
            commit=self._commit,
            queue_delete=self._queue_delete,
            clock=clock,
        )
        self.retention = Retention(
            self.limits.retention,
            self.table,
            self.engine,
            interval=self.limits.sweep_interval,
            commit=self._commit,
            clock=clock,
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self, *, opened: Callable[[], None] | None = None) -> RecoveryReport:
        """Recover and start serving. ``opened`` runs on the recovery thread once the
        engine is open, before the store can commit anything (no pipeline, no sweep
        yet): the single-node start's ``replication.identity.leave``."""
        self._loop = asyncio.get_running_loop()
        state, report = await self._loop.run_in_executor(None, self._open, opened)
        loading = time.monotonic()
        self.engine.progress.phase = "streams"  # made servable: loaded when asked for
        self.expiry.timed.update(state.timed)  # loaded when the sweeper looks at them
        self.next_id = max(state.next_stream_id, max(state.tails, default=0) + 1)
        self.load_seconds = time.monotonic() - loading
        self.engine.progress.phase = "done"
        self.pipeline.start()
        self.expiry.start()
        self.retention.start()
        self.recovery = report
        self.ready = True
        return report

    def _load(self, path: str) -> Stream | None:
        """A committed stream, from LMDB and the engine's tails: the first time it is
        asked for since the start (``StreamTable.get``). Its tail is the published
        one: a stream with a batch in flight or held at the gate is loaded already."""
        found = self.engine.stored_stream(path)
        if found is None:
            return None
        meta, producers = found
        if meta.id in self.held and self.held[meta.id] is None:
            return None  # a standby's frame past the commit point made it: not yet
        s = Stream(path, meta, self.loaded_tail(meta), committed=True)
        for pid, (epoch, seq) in producers.items():
            s.producers[pid] = Producer(pid, epoch, seq)
        return s

    def loaded_tail(self, meta: StreamMeta) -> int:
        """The tail unit a stream loaded now starts with: the engine's, or on a standby the
        one its readers may see while frames past the commit point moved it (``held``)."""
        if meta.id in self.held:  # None: made by a frame being published, tail to come
            unit = self.held[meta.id]
            return unit if unit is not None else meta.fork_offset
        tail = self.engine.tails.get(meta.id)
        return tail.unit if tail else meta.fork_offset

    def _open(self, opened: Callable[[], None] | None) -> tuple[LoadedState, RecoveryReport]:
        found = self.engine.open()
        if opened is not None:
            opened()
        return found

    async def stop(self) -> None:
        self.ready = False
        self.expiry.stop()
        self.retention.stop()
        self.release_waiters()
        with contextlib.suppress(StreamError):
            await self.expiry.flush_touched()
        await self.pipeline.stop()
        await asyncio.get_running_loop().run_in_executor(None, self.engine.close)
        self.reader.close()
        self.json.close()

    def release_waiters(self) -> None:
        """End every live reader's wait as if it had timed out, and later waits at once.

        The server calls this as soon as it begins to stop, before it waits for
        open responses: a reader still waiting would hold the shutdown up.
        """
        self.ready = False
        self.live.release()

    # ---------------------------------------------------------- read-only queries

    @property
    def failed(self) -> str | None:
        return self.engine.failed

    @property
    def version(self) -> object:
        """The engine's last committed batch: it changes whenever anything is committed."""
        return self.engine.lsn

    @property
    def streams(self) -> AllStreams:
        """Every stream by path, for counting and inspection; change it only through the
        store. Going through all of them loads each: for subscriptions' globs."""
        return AllStreams(self.table, self.engine.stored_paths)

    def get(self, path: str, *, touch: bool = False) -> Stream:
        """The committed stream at ``path`` for a client operation, or NotFound / Gone."""
        s = self.table.get(path)
        if s is None or not s.committed:
            raise NotFound("stream not found")
        if s.pending.meta.soft_deleted:
            raise Gone("stream was deleted")
        now = self.clock()
        if s.expired(now):
            self.expiry.expire(s)
            raise NotFound("stream not found (expired)")
        if touch:
            self.expiry.touch(s, now)
        return s

    async def open(self, path: str, *, touch: bool = False) -> Stream:
        return self.get(path, touch=touch)

    def earliest(self, s: Stream) -> int:
        """The first unit a read of ``s`` may ask for: 0 until retention drops data."""
        return earliest(self.table, self.engine, s)

    def is_current(self, s: Stream) -> bool:
        """Whether ``s`` is still the stream at its path and no delete of it is queued."""
        return self.table.by_path.get(s.path) is s and not s.pending.meta.soft_deleted

    # ------------------------------------------------------------------ create

    async def create(self, req: CreateRequest) -> CreateResult:  # noqa: C901 - one check-and-reserve step, in the protocol's order
        if len(req.path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
            raise BadRequest(f"stream path longer than {MAX_PATH_BYTES} bytes (decoded)")
        # The one disk read a create may need, and the split of a JSON body (large
        # ones in a worker process), happen first; from here on everything is checked and
        # reserved in one synchronous step.
        boundary = await sub_offset_boundary(self.table, req.fork, self.reader.record_end)
        parsed = None
        if self.table.get(req.path) is None:
            content_type = req.content_type
            if content_type is None and req.fork is not None:
                src = self.table.get(req.fork.source)
                content_type = src.meta.content_type if src is not None else None
            if req.body and _is_json(content_type):
                parsed = await self.json.split(req.body, allow_empty_array=True)
        now = self.clock()
        existing = self.table.get(req.path)
        if existing is not None and existing.committed and existing.expired(now):
            self.expiry.expire(existing)
            existing = self.table.get(req.path)
        if existing is not None:
            return await self._recreate(existing, req)
        if self.settings.max_streams and self.table.count() >= self.settings.max_streams:
            raise Unavailable("stream limit reached")

        source: Stream | None = None
        fork_unit = 0
        content_type = req.content_type
        if req.fork is not None:
            source = fork_source(
                self.table,
                req.fork,
                max_depth=self.settings.max_fork_depth,
                expire=self.expiry.expire,
                now=now,
            )
            fork_unit = fork_point(source, req.fork, boundary)
            first = self.earliest(source)
            if fork_unit < first:
                raise OffsetGone(first)
            if content_type is None:
                content_type = source.meta.content_type
            elif media_type(content_type) != media_type(source.meta.content_type):
                raise Conflict("content type differs from the source stream's")
        life = lifetime(
            req, source.meta if source is not None else None, self.settings.default_ttl or None
        )
        content_type = content_type or DEFAULT_CONTENT_TYPE
        is_json = media_type(content_type) == JSON_TYPE
        payloads = self._payloads(req.body, is_json, allow_empty_array=True, parsed=parsed)

        sid = self.next_id
        self.next_id += 1
        s, queued = queue_create(
            req,
            sid=sid,
            now=now,
            content_type=content_type,
            life=life,
            source=source,
            fork_unit=fork_unit,
            payloads=payloads,
            on_durable=self._created,
        )
        self.table.add(s)
        s.created = asyncio.get_running_loop().create_future()
        await self._commit(queued.ops, queued.size, queued.apply, s)
        return CreateResult(s, True, queued.tail, req.closed)

    def _created(self, s: Stream) -> None:
        self.expiry.track(s)
        if self.events.on_created:
            self.events.on_created(s)

    async def _recreate(self, s: Stream, req: CreateRequest) -> CreateResult:
        """PUT on an existing path: idempotent success if the configuration matches."""
        if s.pending.meta.soft_deleted:
            raise Conflict("a deleted stream at this path is still referenced by forks")
        m = s.pending.meta
        same = (
            media_type(req.content_type or m.content_type) == media_type(m.content_type)
            and req.closed == m.closed
            and same_lifetime(req, m)
            and matches_fork(req.fork, m)
        )
        if not same:
            raise Conflict("stream already exists with a different configuration")
        if not s.committed:
            # A concurrent create of the same stream is in flight: answer once it is durable.
            assert s.created is not None
            if not await asyncio.shield(s.created):
                raise Unavailable("the concurrent create of this stream failed")
        return CreateResult(s, False, s.tail, s.meta.closed)

    # ------------------------------------------------------------------ append

    async def append(self, req: AppendRequest) -> AppendResult:
        parsed = None
        media = media_type(req.content_type) if req.content_type is not None else None
        if req.body and media == JSON_TYPE:
            ahead = self.get(req.path)  # 404 and 410 come before a JSON 400
            if ahead.is_json and not ahead.pending.meta.closed:
                parsed = await self.json.split(req.body, allow_empty_array=False)
        return await self.append_soon(req, media, parsed)

    def append_soon(
        self, req: AppendRequest, media: str | None, parsed: list[bytes] | None = None
    ) -> asyncio.Future[AppendResult]:
        """One append by ``append_many``: the future has its result, or its refusal."""
        done: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()

        def reply(_: int, outcome: AppendResult | BaseException) -> None:
            if done.done():
                return
            if isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)

        self.append_many([(req, media, parsed)], reply)
        return done

    def append_many(self, items: Sequence[AppendItem], reply: AppendReply) -> None:
        """Appends checked and queued in this turn, in order, as one entry of the next
        batch: one future and one commit action for them all, however many there are.
        ``reply(i, outcome)`` is told each one's result, or its refusal: a refusal at
        once, the rest when durable (a duplicate, when its original is). Each item is
        the request, its media type and its JSON body split ahead (``append``). The
        writer takes a frame of a worker's appends this way (``workers/host.py``): its
        cost per append is what bounds the pod, so no task, coroutine, future or
        closure each."""
        fut: asyncio.Future[BatchStats] | None = None
        ops: list[Op] = []
        taken: list[Taken] = []
        size = 0
        max_producers = self.settings.max_producers_per_stream
        for i, (req, media, parsed) in enumerate(items):
            try:
                s, settled, payloads = self._take(req, media, parsed)
                if settled is not None:  # answered once what is queued for it is durable
                    self._when_settled(s, settled).add_done_callback(
                        functools.partial(_forward, reply, i)
                    )
                    continue
                reserved, bytes_, meta_written = reserve_append(
                    s, req, payloads, ops, max_producers=max_producers
                )
            except Exception as exc:  # nothing of this one was queued
                reply(i, exc)
                continue
            if meta_written:
                self.expiry.written(s)
            if fut is None:
                fut = asyncio.get_running_loop().create_future()
            s.inflight = fut  # a duplicate of it later in the group waits for it
            size += bytes_
            taken.append((i, reserved, req.close, req.producer))
        if fut is None:
            return
        apply = functools.partial(self._published, taken)
        self.pipeline.submit(ops, size, apply, future=fut, requests=len(taken))
        fut.add_done_callback(functools.partial(self._durable, taken, reply))

    def _published(self, taken: list[Taken]) -> None:
        """A group's commit action: each append's changes shown, in order."""
        on_appended = self.events.on_appended
        for _, reserved, _, _ in taken:
            publish_append(reserved)
            if reserved[1] and on_appended is not None:
                on_appended(reserved[0])

    def _durable(
        self, taken: list[Taken], reply: AppendReply, f: asyncio.Future[BatchStats]
    ) -> None:
        """A group's batch is durable (or failed): each append's result, or the failure."""
        failed = StorageError("the write was cancelled") if f.cancelled() else f.exception()
        if failed is not None:
            error = _unavailable(failed)
            for i, *_ in taken:
                reply(i, error)
            return
        stats = f.result()
        for i, (s, payloads, _, tail, _, _, _), close, producer in taken:
            self.retention.appended(s)  # whether or not the caller still waits
            closed = close or s.meta.closed
            reply(i, AppendResult(tail, closed, False, producer, bool(payloads), stats, stats.term))

    def _take(  # noqa: C901 - the append path: a call more per append costs more than a branch
        self, req: AppendRequest, media: str | None, parsed: list[bytes] | None
    ) -> tuple[Stream, AppendResult | None, list[bytes]]:
        """An append's checks, before anything changes: a refusal raises; a result that
        needs no write (a duplicate, a close already made) comes back to be answered
        when what is queued for the stream is durable; else the payloads to queue."""
        s = self.get(req.path, touch=True)
        m = s.pending.meta
        p = req.producer
        if not req.body and not req.close:
            raise BadRequest("empty body: an append needs data (or Stream-Closed: true)")
        if m.closed:
            if p is not None and m.closed_by == (p.id, p.epoch, p.seq):
                return s, AppendResult(s.tail, True, duplicate=True, producer=p), []
            if req.close and not req.body:
                return s, AppendResult(s.tail, True), []
            raise StreamClosed("stream is closed", s.pending.tail)
        if req.body and media != s.media:
            if media is None:
                raise BadRequest("Content-Type is required with a body")
            raise Conflict("content type does not match the stream's")
        if p is not None:
            verdict = check_producer(p, s.producer(p.id))
            if verdict.event is not None and self.events.on_producer:
                self.events.on_producer(verdict.event)
            if verdict.error is not None:
                raise verdict.error
            if verdict.duplicate is not None:
                # The original may still be on its way to disk: a duplicate is
                # acknowledged only once the original is.
                duplicate = AppendResult(
                    s.tail, s.meta.closed, duplicate=True, producer=verdict.duplicate
                )
                return s, duplicate, []
        if (
            req.stream_seq is not None
            and m.stream_seq is not None
            and req.stream_seq <= m.stream_seq
        ):
            raise Conflict("Stream-Seq is not greater than the last one")
        return s, None, self._payloads(req.body, s.is_json, allow_empty_array=False, parsed=parsed)

    def _payloads(
        self, body: bytes, is_json: bool, *, allow_empty_array: bool, parsed: list[bytes] | None
    ) -> list[bytes]:
        if not body:
            return []
        if not is_json:
            return [body]
        if parsed is not None:
            return parsed
        # Not split ahead (the stream changed while the body was split): split it now.
        return self.json.split_now(body, allow_empty_array=allow_empty_array)

    # ------------------------------------------------------------------ delete

    async def delete(self, path: str) -> None:
        s = self.get(path)
        ops, apply = self._queue_delete(s, "deleted")
        await self._commit(ops, 0, apply, s)

    def _queue_delete(self, s: Stream, reason: str) -> tuple[list[Op], Callable[[], None]]:
        def announce(path: str) -> None:
            if self.events.on_deleted:
                self.events.on_deleted(path, reason)

        return queue_delete(self.table, s, announce)

    # ------------------------------------------------------------- keyed values

    async def put_keyed_value(self, space: str, key: str, value: bytes | None) -> None:
        """Set (None: delete) one keyed value; returns once it is durable (``keyed_values.py``)."""
        op = keyed_value_op(space, key, value)
        if not self.pipeline.running:
            raise Unavailable("the store is not running")
        await self._commit([op], len(value or b""), None)

    def keyed_values(self, space: str) -> dict[str, bytes]:
        """Every committed keyed value of ``space`` by key, read from LMDB (for start-up)."""
        check_space(space)
        if self.engine.meta is None:
            raise Unavailable("the store is not open")
        return self.engine.keyed_values(space)

    # --------------------------------------------------------------- commit

    async def _commit(
        self, ops: list[Op], size: int, apply: Callable[[], None] | None, *streams: Stream
    ) -> BatchStats:
        fut = self.pipeline.submit(ops, size, apply)
        for st in streams:
            st.inflight = fut
        try:
            return await asyncio.shield(fut)
        except StorageError as exc:
            raise _unavailable(exc) from None

    def _when_settled(self, s: Stream, result: AppendResult) -> asyncio.Future[AppendResult]:
        """``result`` once every change already queued for ``s`` is durable (a duplicate's
        original, a close already on its way), or Unavailable if that failed; with the
        term it is answered in (docs/replication.md: every acknowledgement of a
        primary names its term, a duplicate's too)."""
        replica = self.engine.replica
        result.term = replica.term if replica is not None else 0
        fut = s.inflight
        done: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        if fut is None or (fut.done() and not fut.cancelled() and fut.exception() is None):
            done.set_result(result)
            return done

        def settled(f: asyncio.Future[BatchStats]) -> None:
            if done.done():
                return
            failed = None if f.cancelled() else f.exception()
            if isinstance(failed, StorageError):
                failed = Unavailable(f"an earlier write to this stream failed: {failed}")
            if failed is not None:
                done.set_exception(failed)
            else:
                done.set_result(result)

        fut.add_done_callback(settled)
        return done

    def _on_batch(self, stats: BatchStats, requests: int) -> None:
        """A batch committed: the listener is looked up now, as ``_on_failure``'s is, since
        a node fills the events in after the store and its pipeline are built."""
        if self.events.on_batch:
            self.events.on_batch(stats, requests)

    def _on_failure(self, error: StorageError) -> None:
        """A batch failed: forget every queued change, as if it had never been asked."""
        log.error("write batch failed, queued changes rolled back: %s", error)
        if self.events.on_failure:
            self.events.on_failure(error)
        self.table.rollback()

    # ------------------------------------------------------------------- read

    async def read(self, s: Stream, start: int, max_bytes: int) -> ReadResult:
        """Committed data from ``start``, stitched across fork boundaries."""
        return await self.reader.read(s, start, max_bytes)

    async def wait(
        self, s: Stream, unit: int, deadline: float, until: asyncio.Future[Any] | None = None
    ) -> bool:
        """Wait until ``s`` has data past ``unit``, is closed, or goes away.

        False once the loop's clock reaches ``deadline``, when ``until`` resolves
        (the reader hung up) or when the store stops.
        """
        if s.tail > unit or s.meta.closed:
            return True
        if not self.ready or (until is not None and until.done()):
            return False
        return await self.live.wait(s, deadline, until)

    # ------------------------------------------------------------------ upkeep

    def sweep(self) -> int:
        """Expire every stream whose TTL or Expires-At has passed."""
        return self.expiry.sweep()

    def pause_own_writes(self) -> None:
        """Delete and drop nothing of its own accord: no TTL expiry (by the sweeper or
        on a read) and no retention drop. A standby's or a follower's store: the
        primary's deletions and drops reach it as frames. Before ``start``, the
        sweepers never start."""
        self.expiry.pause()
        self.retention.pause()

    def resume_own_writes(self) -> None:
        """Expire and drop again (this replica became primary)."""
        self.expiry.resume()
        self.retention.resume()


def _forward(reply: AppendReply, i: int, done: asyncio.Future[AppendResult]) -> None:
    """A settled append's outcome to ``reply`` (``append_many``)."""
    reply(i, done.exception() or done.result())


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and media_type(content_type) == JSON_TYPE


if TYPE_CHECKING:  # mypy checks that the store offers what each layer above asks of it

    def _implements(store: StreamStore) -> tuple[ProtocolStore, SubscriptionStore]:
        return store, store


__all__ = [
    "AppendRequest",
    "AppendResult",
    "BadRequest",
    "CreateRequest",
    "CreateResult",
    "ForkRequest",
    "Producer",
    "ReadResult",
    "StoreEvents",
    "StoreLimits",
    "StreamStore",
]


def _unavailable(exc: BaseException) -> BaseException:
    """A failed batch as the refusal the client gets (503, or 507 when the disk is full);
    anything else that failed as it is."""
    if isinstance(exc, StorageFailed):
        return Unavailable(str(exc))
    if isinstance(exc, StorageError):
        return Unavailable(str(exc), disk_full=exc.disk_full)
    return exc
