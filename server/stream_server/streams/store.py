"""The stream store: every protocol rule about creating, appending, closing,
deleting, forking and expiring streams, over the storage engine.

All validation runs on the event loop against each stream's pending state,
so a request is checked and its effect reserved in one step, with no locks;
the effect becomes visible to readers only when its batch is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from stream_format.meta import MAX_KEY_BYTES
from stream_format.records import KIND_BYTES, Producer
from stream_server.engine import (
    BatchStats,
    DamagedStream,
    Engine,
    RecoveryReport,
    StorageError,
    StorageFailed,
    StreamMeta,
)
from stream_server.engine.ops import (
    Append,
    CreateLog,
    DeleteProducer,
    DeleteStream,
    DropLog,
    Op,
    PutProducer,
    PutStream,
)
from stream_server.engine.pipeline import CommitPipeline
from stream_server.streams.errors import (
    BadRequest,
    Conflict,
    Damaged,
    Gone,
    NotFound,
    ProducerFenced,
    SequenceGap,
    StreamClosed,
    StreamError,
    Unavailable,
)
from stream_server.streams.jsonmode import JsonSplitter
from stream_server.streams.model import JSON_TYPE, ProducerState, Stream, media_type

log = logging.getLogger("stream_server.streams")

DEFAULT_CONTENT_TYPE = "application/octet-stream"
# Both end up in LMDB keys (see stream_format.meta.MAX_KEY_BYTES).
MAX_PATH_BYTES = MAX_KEY_BYTES
MAX_PRODUCER_ID_BYTES = 256


@dataclass(slots=True)
class ProducerHeaders:
    id: str
    epoch: int
    seq: int


@dataclass(slots=True)
class ForkRequest:
    source: str
    offset: int | None  # unit; None means the source's tail
    sub_offset: int = 0


@dataclass(slots=True)
class CreateRequest:
    path: str
    content_type: str | None
    body: bytes = b""
    ttl: int | None = None
    expires_at: str | None = None
    expires_at_ts: float | None = None
    closed: bool = False
    fork: ForkRequest | None = None


@dataclass(slots=True)
class AppendRequest:
    path: str
    content_type: str | None
    body: bytes
    stream_seq: str | None = None
    producer: ProducerHeaders | None = None
    close: bool = False


@dataclass(slots=True)
class CreateResult:
    stream: Stream
    created: bool
    tail: int
    closed: bool


@dataclass(slots=True)
class AppendResult:
    tail: int
    closed: bool
    duplicate: bool = False
    producer: ProducerHeaders | None = None
    appended: bool = False  # new data was written (not a duplicate, not close-only)
    batch: BatchStats | None = None  # where the commit's time went


@dataclass(slots=True)
class ReadResult:
    payloads: list[bytes]
    start: int
    next: int
    tail: int  # committed tail when the read was served
    closed: bool  # closed and the read reached the final unit

    @property
    def up_to_date(self) -> bool:
        return self.next >= self.tail


@dataclass(slots=True)
class StoreEvents:
    """Hooks for metrics; each is optional and called on the loop."""

    on_batch: Callable | None = None
    on_created: Callable[[Stream], None] | None = None
    on_deleted: Callable[[str, str], None] | None = None  # path, "deleted" | "expired"
    on_failure: Callable[[StorageError], None] | None = None
    on_producer: Callable[[str], None] | None = None  # "duplicate" | "fenced" | "gap"


@dataclass
class StoreLimits:
    read_threads: int = 4
    default_ttl: int | None = None
    sweep_interval: float = 1.0
    max_streams: int | None = None
    max_producers_per_stream: int = 1000
    max_fork_depth: int = 64
    max_json_messages: int = 100_000


class StreamStore:
    def __init__(
        self,
        data_dir: Path,
        *,
        limits: StoreLimits | None = None,
        events: StoreEvents | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.engine = engine or Engine(data_dir)
        self.limits = limits or StoreLimits()
        self.events = events or StoreEvents()
        self.streams: dict[str, Stream] = {}
        self.next_id = 1
        self.ready = False
        self.recovery: RecoveryReport | None = None
        self.pipeline = CommitPipeline(
            self.engine, on_failure=self._on_failure, on_batch=self.events.on_batch
        )
        self._readers = ThreadPoolExecutor(self.limits.read_threads, thread_name_prefix="reader")
        self.json = JsonSplitter(self.limits.max_json_messages)
        self._pending_deleted: dict[str, Stream] = {}
        self._waiters: set[asyncio.Future] = set()  # every live reader's wait, to end them on stop
        self._touched: set[str] = set()
        self._expiring: set[str] = set()
        self._timed: set[str] = set()  # streams with a TTL or Expires-At: the sweeper's list
        self._sweeper: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> RecoveryReport:
        self._loop = asyncio.get_running_loop()
        state, report = await self._loop.run_in_executor(None, self.engine.open)
        for path, meta in state.streams.items():
            tail = state.tails.get(meta.id)
            unit = tail.unit if tail else meta.fork_offset
            s = Stream(path, meta, unit, committed=True)
            for pid, (epoch, seq) in state.producers.get(meta.id, {}).items():
                s.producers[pid] = ProducerState(epoch, seq)
            self.streams[path] = s
            if meta.ttl is not None or meta.expires_at_ts is not None:
                self._timed.add(path)
        self.next_id = max(
            state.next_stream_id, max((m.id for m in state.streams.values()), default=0) + 1
        )
        self.pipeline.start()
        self._sweeper = asyncio.create_task(self._sweep_forever())
        self.recovery = report
        self.ready = True
        return report

    async def stop(self) -> None:
        self.ready = False
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.release_waiters()
        with contextlib.suppress(StreamError):
            await self._flush_touched()
        await self.pipeline.stop()
        await asyncio.get_running_loop().run_in_executor(None, self.engine.close)
        self._readers.shutdown(wait=True)
        self.json.close()

    def release_waiters(self) -> None:
        """End every live reader's wait as if it had timed out (used on shutdown)."""
        for waiter in list(self._waiters):
            _time_out(waiter)

    @property
    def failed(self) -> str | None:
        return self.engine.failed

    # ------------------------------------------------------------------ lookup

    def get(self, path: str, *, touch: bool = False) -> Stream:
        """The committed stream at ``path`` for a client operation, or NotFound / Gone."""
        s = self.streams.get(path)
        if s is None or not s.committed:
            raise NotFound("stream not found")
        if s.pmeta.soft_deleted:
            raise Gone("stream was deleted")
        now = time.time()
        if s.expired(now):
            self._expire(s)
            raise NotFound("stream not found (expired)")
        if touch:
            self._touch(s, now)
        return s

    def _touch(self, s: Stream, now: float) -> None:
        s.meta.touched_at = s.pmeta.touched_at = now
        if s.meta.ttl is not None:
            self._touched.add(s.path)

    # ------------------------------------------------------------------ create

    async def create(self, req: CreateRequest) -> CreateResult:
        if len(req.path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
            raise BadRequest(f"stream path longer than {MAX_PATH_BYTES} bytes (decoded)")
        # The one disk read a create may need, and the split of a JSON body (large
        # ones in a worker process), happen first; from here on everything is checked and
        # reserved in one synchronous step.
        boundary = await self._sub_offset_boundary(req.fork)
        parsed = None
        if req.path not in self.streams:
            content_type = req.content_type
            if content_type is None and req.fork is not None:
                src = self.streams.get(req.fork.source)
                content_type = src.meta.content_type if src is not None else None
            if req.body and _is_json(content_type):
                parsed = await self.json.split(req.body, allow_empty_array=True)
        now = time.time()
        existing = self.streams.get(req.path)
        if existing is not None and existing.committed and existing.expired(now):
            self._expire(existing)
            existing = self.streams.get(req.path)
        if existing is not None:
            return await self._recreate(existing, req)
        if self.limits.max_streams is not None and len(self.streams) >= self.limits.max_streams:
            raise Unavailable("stream limit reached")

        source: Stream | None = None
        fork_unit = 0
        content_type = req.content_type
        ttl, expires_at, expires_at_ts = req.ttl, req.expires_at, req.expires_at_ts
        if req.fork is not None:
            source, fork_unit = self._resolve_fork(req, boundary)
            if content_type is None:
                content_type = source.meta.content_type
            elif media_type(content_type) != media_type(source.meta.content_type):
                raise Conflict("content type differs from the source stream's")
        expiry_from = "request"
        if req.fork is not None and ttl is None and expires_at is None:
            ttl = source.meta.ttl
            expires_at, expires_at_ts = source.meta.expires_at, source.meta.expires_at_ts
            expiry_from = "source"
        if ttl is None and expires_at is None and self.limits.default_ttl:
            ttl = self.limits.default_ttl
            expiry_from = "default"
        content_type = content_type or DEFAULT_CONTENT_TYPE
        is_json = media_type(content_type) == JSON_TYPE
        payloads = self._payloads(req.body, is_json, allow_empty_array=True, parsed=parsed)

        sid = self.next_id
        self.next_id += 1
        meta = StreamMeta(
            id=sid,
            content_type=content_type,
            created_at=now,
            ttl=ttl,
            expires_at=expires_at,
            expires_at_ts=expires_at_ts,
            closed=req.closed,
            fork_from=source.path if source else None,
            fork_offset=fork_unit,
            touched_at=now,
            extra={"expiry_from": expiry_from},
        )
        s = Stream(req.path, meta, fork_unit, committed=False)
        ops: list[Op] = [CreateLog(sid, fork_unit)]
        size = 0
        if payloads:
            ops.append(Append(sid, s.kind, payloads))
            s.p_tail = fork_unit + _units(s.kind, payloads)
            size = sum(map(len, payloads))
        ops.append(PutStream(req.path, replace(meta)))
        src_meta = None
        if source is not None:
            source.pmeta.refcount += 1
            src_meta = replace(source.pmeta)
            ops.append(PutStream(source.path, replace(src_meta)))
        self.streams[req.path] = s
        s.created = asyncio.get_running_loop().create_future()
        tail = s.p_tail

        def apply() -> None:
            s.committed = True
            s.tail = tail
            assert s.created is not None
            s.created.set_result(True)
            if meta.ttl is not None or meta.expires_at_ts is not None:
                self._timed.add(s.path)
            if source is not None and src_meta is not None:
                source.meta.refcount = src_meta.refcount
            if self.events.on_created:
                self.events.on_created(s)

        await self._commit(ops, size, apply, s)
        return CreateResult(s, True, tail, req.closed)

    async def _recreate(self, s: Stream, req: CreateRequest) -> CreateResult:
        """PUT on an existing path: idempotent success if the configuration matches."""
        if s.pmeta.soft_deleted:
            raise Conflict("a deleted stream at this path is still referenced by forks")
        m = s.pmeta
        if (
            req.ttl is None
            and req.expires_at is None
            and m.extra.get("expiry_from")
            in (
                "source",
                "default",
            )
        ):
            same_expiry = True  # the expiry was not asked for the first time either
        else:
            same_expiry = (req.ttl, req.expires_at_ts) == (m.ttl, m.expires_at_ts)
        same = (
            media_type(req.content_type or m.content_type) == media_type(m.content_type)
            and req.closed == m.closed
            and same_expiry
        )
        if req.fork is not None:
            same = same and req.fork.source == m.fork_from
            if same and req.fork.offset is not None:
                same = m.fork_offset == req.fork.offset + req.fork.sub_offset
        elif m.fork_from is not None:
            same = False
        if not same:
            raise Conflict("stream already exists with a different configuration")
        if not s.committed:
            # A concurrent create of the same stream is in flight: answer once it is durable.
            assert s.created is not None
            if not await asyncio.shield(s.created):
                raise Unavailable("the concurrent create of this stream failed")
        return CreateResult(s, False, s.tail, s.meta.closed)

    def _resolve_fork(self, req: CreateRequest, boundary: int | None) -> tuple[Stream, int]:
        assert req.fork is not None
        f = req.fork
        src = self.streams.get(f.source)
        if src is None or not src.committed:
            raise NotFound("fork source stream not found")
        if src.pmeta.soft_deleted:
            raise Conflict("fork source stream was deleted")
        if src.expired(time.time()):
            self._expire(src)
            raise NotFound("fork source stream not found (expired)")
        if self._fork_depth(src) >= self.limits.max_fork_depth:
            raise BadRequest(
                f"fork chain too deep: at most {self.limits.max_fork_depth} forks below a root"
            )
        unit = src.tail if f.offset is None else f.offset
        if unit > src.tail or unit < 0:
            raise BadRequest("fork offset is beyond the source stream's tail")
        if f.sub_offset:
            unit = self._resolve_sub_offset(src, unit, f.sub_offset, boundary)
        return src, unit

    def _fork_depth(self, s: Stream) -> int:
        """How many forks lie between ``s`` and its root stream (0 for a root)."""
        depth = 0
        parent = s.pmeta.fork_from
        while parent is not None:
            depth += 1
            up = self.streams.get(parent) or self._pending_deleted.get(parent)
            parent = up.pmeta.fork_from if up is not None else None
        return depth

    def _resolve_sub_offset(self, src: Stream, anchor: int, sub: int, boundary: int | None) -> int:
        """Move a fork point ``sub`` units past ``anchor``, within the next record.

        For JSON streams a unit is one message; otherwise one payload byte. The
        fork point may not pass the end of the data that begins at ``anchor``
        (``boundary``, read from the log before validation began).
        """
        target = anchor + sub
        if target > src.tail:
            raise BadRequest("fork sub-offset is past the end of the source stream")
        if src.is_json:
            return target
        if boundary is None:
            raise Conflict("the fork source changed while the fork was being created; retry")
        if target > boundary:
            raise BadRequest("fork sub-offset is past the next data boundary")
        return target

    async def _sub_offset_boundary(self, fork: ForkRequest | None) -> int | None:
        """End unit of the source record a binary sub-offset fork starts in, read off the loop."""
        if fork is None or not fork.sub_offset or fork.offset is None:
            return None
        src = self.streams.get(fork.source)
        if src is None or not src.committed or src.is_json:
            return None
        for owner, lo, hi in self._chain(src, src.tail):
            if lo <= fork.offset < hi:
                end = await asyncio.get_running_loop().run_in_executor(
                    self._readers, self.engine.record_end, owner.id, fork.offset
                )
                return min(end, hi)
        return fork.offset

    # ------------------------------------------------------------------ append

    async def append(self, req: AppendRequest) -> AppendResult:
        parsed = None
        if req.body and _is_json(req.content_type):
            ahead = self.get(req.path)  # 404 and 410 come before a JSON 400
            if ahead.is_json and not ahead.pmeta.closed:
                parsed = await self.json.split(req.body, allow_empty_array=False)
        s = self.get(req.path, touch=True)
        m = s.pmeta
        p = req.producer
        if not req.body and not req.close:
            raise BadRequest("empty body: an append needs data (or Stream-Closed: true)")
        if m.closed:
            if p is not None and m.closed_by == (p.id, p.epoch, p.seq):
                await self._settled(s)
                return AppendResult(s.tail, True, duplicate=True, producer=p)
            if req.close and not req.body:
                await self._settled(s)
                return AppendResult(s.tail, True)
            raise StreamClosed("stream is closed", s.p_tail)
        if req.body and (
            req.content_type is None or media_type(req.content_type) != media_type(m.content_type)
        ):
            if req.content_type is None:
                raise BadRequest("Content-Type is required with a body")
            raise Conflict("content type does not match the stream's")

        ops: list[Op] = []
        pstate: ProducerState | None = None
        if p is not None:
            if len(p.id.encode("utf-8", "surrogatepass")) > MAX_PRODUCER_ID_BYTES:
                raise BadRequest(f"Producer-Id longer than {MAX_PRODUCER_ID_BYTES} bytes")
            cur = s.producer(p.id)
            if cur is not None and p.epoch < cur.epoch:
                if self.events.on_producer:
                    self.events.on_producer("fenced")
                raise ProducerFenced(cur.epoch)
            if cur is None or p.epoch > cur.epoch:
                if p.seq != 0:
                    if cur is None:
                        raise SequenceGap(0, p.seq)
                    raise BadRequest("a new producer epoch must start at Producer-Seq 0")
            elif p.seq <= cur.seq:
                if self.events.on_producer:
                    self.events.on_producer("duplicate")
                # The original may still be on its way to disk: a duplicate is
                # acknowledged only once the original is.
                await self._settled(s)
                return AppendResult(
                    s.tail,
                    s.meta.closed,
                    duplicate=True,
                    producer=ProducerHeaders(p.id, p.epoch, cur.seq),
                )
            elif p.seq > cur.seq + 1:
                if self.events.on_producer:
                    self.events.on_producer("gap")
                raise SequenceGap(cur.seq + 1, p.seq)
            pstate = ProducerState(p.epoch, p.seq)
        if (
            req.stream_seq is not None
            and m.stream_seq is not None
            and req.stream_seq <= m.stream_seq
        ):
            raise Conflict("Stream-Seq is not greater than the last one")

        payloads = self._payloads(req.body, s.is_json, allow_empty_array=False, parsed=parsed)
        # -- everything below changes pending state: no more refusals.
        size = 0
        if payloads:
            producer = Producer(p.id, p.epoch, p.seq) if p is not None else None
            ops.append(Append(s.id, s.kind, payloads, producer))
            s.p_tail += _units(s.kind, payloads)
            size = sum(map(len, payloads))
        meta_changed = False
        evicted: list[str] = []
        if pstate is not None:
            evicted = self._producers_to_forget(s, p.id)
            ops += [DeleteProducer(s.id, victim) for victim in evicted]
            s.p_producers[p.id] = pstate
            ops.append(PutProducer(s.id, p.id, pstate.epoch, pstate.seq))
        if req.stream_seq is not None:
            m.stream_seq = req.stream_seq
            meta_changed = True
        if req.close:
            m.closed = True
            m.closed_by = (p.id, p.epoch, p.seq) if p is not None else None
            meta_changed = True
        if m.ttl is not None:
            meta_changed = True
        new_meta = replace(m) if meta_changed else None
        if new_meta is not None:
            ops.append(PutStream(s.path, replace(new_meta)))
            self._touched.discard(s.path)
        tail = s.p_tail
        first = tail - _units(s.kind, payloads)
        pid = p.id if p is not None else None

        def apply() -> None:
            if payloads:
                _remember_recent(s, first, tail, payloads)
            s.tail = tail
            if new_meta is not None:
                new_meta.touched_at = max(new_meta.touched_at, s.meta.touched_at)
                s.meta = new_meta
            for victim in evicted:
                s.producers.pop(victim, None)
            if pstate is not None and pid is not None:
                s.producers.pop(pid, None)  # re-inserted last: the dict is in recency order
                s.producers[pid] = pstate
                if s.p_producers.get(pid) is pstate:
                    del s.p_producers[pid]
            s.notify()

        stats = await self._commit(ops, size, apply, s)
        return AppendResult(
            tail, req.close or s.meta.closed, producer=p, appended=bool(payloads), batch=stats
        )

    def _producers_to_forget(self, s: Stream, pid: str) -> list[str]:
        """The least recently active producers to drop so that a new one fits the cap.

        PROTOCOL.md 5.2.1 lets a server expire producer state, after which the
        producer is treated as new: a forgotten producer's next sequence number
        gets a sequence-gap 409 (expected 0), so it cannot append past a hole;
        only a retry of its very first append could be taken twice, which the
        least-recently-active choice makes unlikely. Producers with a write in
        flight are never chosen. ``s.producers`` is kept in recency order.
        """
        if pid in s.producers or pid in s.p_producers:
            return []
        count = len(s.producers) + sum(1 for k in s.p_producers if k not in s.producers)
        excess = count + 1 - self.limits.max_producers_per_stream
        if excess <= 0:
            return []
        victims = list(itertools.islice(s.producers, excess + len(s.p_producers)))
        return [k for k in victims if k not in s.p_producers][:excess]

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
        """Ops and commit action that delete ``s``: soft if forks read through it."""
        if s.pmeta.refcount > 0:
            s.pmeta.soft_deleted = True
            meta = replace(s.pmeta)

            def apply_soft() -> None:
                s.meta = meta
                s.notify()
                if self.events.on_deleted:
                    self.events.on_deleted(s.path, reason)

            return [PutStream(s.path, replace(meta))], apply_soft
        ops: list[Op] = []
        gone: list[Stream] = []
        updated: list[tuple[Stream, StreamMeta]] = []
        cur: Stream | None = s
        while cur is not None:
            ops += [DeleteStream(cur.path), DropLog(cur.id)]
            gone.append(cur)
            self.streams.pop(cur.path, None)
            self._pending_deleted[cur.path] = cur
            parent_path = cur.pmeta.fork_from
            cur = None
            if parent_path is not None:
                parent = self.streams.get(parent_path) or self._pending_deleted.get(parent_path)
                if parent is not None:
                    parent.pmeta.refcount -= 1
                    if parent.pmeta.refcount <= 0 and parent.pmeta.soft_deleted:
                        cur = parent  # cascade: the last fork of a deleted stream is gone
                    else:
                        meta = replace(parent.pmeta)
                        ops.append(PutStream(parent.path, replace(meta)))
                        updated.append((parent, meta))

        def apply() -> None:
            for g in gone:
                if self._pending_deleted.get(g.path) is g:
                    del self._pending_deleted[g.path]
                g.notify()
                if self.events.on_deleted:
                    self.events.on_deleted(g.path, reason)
            for parent, meta in updated:
                parent.meta.refcount = meta.refcount

        return ops, apply

    def _expire(self, s: Stream) -> None:
        """Delete an expired stream in the background (soft if forks need it)."""
        if s.path in self._expiring or s.pmeta.soft_deleted:
            return
        self._expiring.add(s.path)
        ops, apply = self._queue_delete(s, "expired")

        async def run() -> None:
            try:
                await self._commit(ops, 0, apply)
            except StreamError as exc:
                log.warning("could not expire stream %s: %s", s.path, exc)
            finally:
                self._expiring.discard(s.path)

        asyncio.get_running_loop().create_task(run())

    # --------------------------------------------------------------- commit

    async def _commit(
        self, ops: list[Op], size: int, apply: Callable[[], None], *streams: Stream
    ) -> BatchStats:
        fut = self.pipeline.submit(ops, size, apply)
        for st in streams:
            st.inflight = fut
        try:
            return await asyncio.shield(fut)
        except StorageFailed as exc:
            raise Unavailable(str(exc)) from None
        except StorageError as exc:
            raise Unavailable(str(exc), disk_full=exc.disk_full) from None

    async def _settled(self, s: Stream) -> None:
        """Wait until every change already queued for ``s`` is durable (or failed)."""
        fut = s.inflight
        if fut is None or (fut.done() and not fut.cancelled() and fut.exception() is None):
            return
        try:
            await asyncio.shield(fut)
        except StorageError as exc:
            raise Unavailable(f"an earlier write to this stream failed: {exc}") from None

    def _on_failure(self, error: StorageError) -> None:
        """A batch failed: forget every queued change, as if it had never been asked."""
        log.error("write batch failed, queued changes rolled back: %s", error)
        if self.events.on_failure:
            self.events.on_failure(error)
        for path, s in list(self.streams.items()):
            if not s.committed:
                del self.streams[path]
                if s.created is not None and not s.created.done():
                    s.created.set_result(False)
            else:
                s.reset_pending()
        for path, s in self._pending_deleted.items():
            s.reset_pending()
            self.streams[path] = s
        self._pending_deleted.clear()

    # ------------------------------------------------------------------- read

    async def read(self, s: Stream, start: int, max_bytes: int) -> ReadResult:
        """Committed data from ``start``, stitched across fork boundaries."""
        tail = s.tail
        closed = s.meta.closed
        if start >= tail:
            return ReadResult([], start, start, tail, closed)
        recent = _from_recent(s, start, tail, max_bytes)
        if recent is not None:
            payloads, nxt = recent
            return ReadResult(payloads, start, nxt, tail, closed and nxt >= tail)
        loop = asyncio.get_running_loop()
        payloads: list[bytes] = []
        cur = start
        budget = max_bytes
        for owner, lo, hi in self._chain(s, tail):
            if cur >= hi:
                continue
            if budget <= 0:
                break
            cur = max(cur, lo)
            try:
                got, nxt, hint = await loop.run_in_executor(
                    self._readers,
                    self.engine.read,
                    owner.id,
                    owner.kind,
                    cur,
                    hi,
                    budget,
                    owner.read_hint,
                )
            except DamagedStream as exc:
                raise Damaged(f"stream data failed its checksum and is not served: {exc}") from None
            owner.read_hint = hint
            payloads += got
            budget -= sum(map(len, got))
            cur = nxt
            if cur < hi:
                break
        return ReadResult(payloads, start, cur, tail, closed and cur >= tail)

    def _chain(self, s: Stream, hi: int) -> list[tuple[Stream, int, int]]:
        """The (stream, from unit, to unit) pieces that make up ``s`` below ``hi``."""
        pieces: list[tuple[Stream, int, int]] = []
        cur: Stream | None = s
        while cur is not None:
            lo = cur.meta.fork_offset
            pieces.append((cur, lo, hi))
            hi = min(hi, lo)
            parent = cur.meta.fork_from
            cur = None
            if parent is not None and hi > 0:
                cur = self.streams.get(parent) or self._pending_deleted.get(parent)
        pieces.reverse()
        return pieces

    async def wait(
        self, s: Stream, unit: int, timeout: float, until: asyncio.Future | None = None
    ) -> bool:
        """Wait until ``s`` has data past ``unit``, is closed, or goes away.

        False on timeout, when ``until`` resolves (the reader hung up) or when
        the store stops.
        """
        if s.tail > unit or s.meta.closed:
            return True
        if not self.ready or (until is not None and until.done()):
            return False
        # One future and one timer per waiter: with thousands of idle long-polls,
        # what a wake-up costs per reader is what bounds the last reader's latency.
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        s.waiters.add(waiter)
        self._waiters.add(waiter)
        timer = loop.call_later(timeout, _time_out, waiter)

        def hung_up(_: asyncio.Future) -> None:
            _time_out(waiter)

        if until is not None:
            until.add_done_callback(hung_up)
        try:
            return await waiter
        finally:
            timer.cancel()
            s.waiters.discard(waiter)
            self._waiters.discard(waiter)
            if until is not None:
                until.remove_done_callback(hung_up)

    # ------------------------------------------------------------------ upkeep

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.limits.sweep_interval)
            try:
                self.sweep()
                await self._flush_touched()
            except StreamError as exc:
                log.warning("sweep: %s", exc)
            except Exception:
                log.exception("sweep failed")

    def sweep(self) -> int:
        """Expire every stream whose TTL or Expires-At has passed."""
        now = time.time()
        expired = []
        for path in list(self._timed):
            s = self.streams.get(path)
            if s is None:
                self._timed.discard(path)
            elif s.committed and not s.pmeta.soft_deleted and s.expired(now):
                expired.append(s)
        for s in expired:
            self._expire(s)
        return len(expired)

    async def _flush_touched(self) -> None:
        """Persist read-renewed TTL clocks, so a restart does not expire them early."""
        if not self._touched:
            return
        ops: list[Op] = []
        for path in self._touched:
            s = self.streams.get(path)
            if s is not None and s.committed:
                ops.append(PutStream(path, replace(s.pmeta)))
        self._touched.clear()
        if ops:
            await self._commit(ops, 0, lambda: None)


RECENT_MAX_BYTES = 1 << 20


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)


def _remember_recent(s: Stream, first: int, stop: int, payloads: list[bytes]) -> None:
    """Keep a just-committed append in memory while live readers wait on the stream.

    Woken long-poll and SSE readers then get it without a disk read or a thread
    hop. Only streams with waiters keep anything, and at most about 1 MiB each.
    """
    if not s.waiters:
        s.recent = None
        return
    r = s.recent
    if r is not None and r[1] == first and r[3] + sum(map(len, payloads)) <= RECENT_MAX_BYTES:
        s.recent = (r[0], stop, r[2] + payloads, r[3] + sum(map(len, payloads)))
    else:
        size = sum(map(len, payloads))
        s.recent = (first, stop, list(payloads), size) if size <= RECENT_MAX_BYTES else None


def _from_recent(s: Stream, start: int, tail: int, max_bytes: int) -> tuple[list, int] | None:
    r = s.recent
    if r is None or not (r[0] <= start < r[1] == tail) or start < s.meta.fork_offset:
        return None
    out: list = []
    unit, total = r[0], 0
    for payload in r[2]:
        units = len(payload) if s.kind == KIND_BYTES else 1
        if unit + units <= start:
            unit += units
            continue
        if s.kind == KIND_BYTES:
            part = memoryview(payload)[start - unit if unit < start else 0 :]
            part = part[: max_bytes - total]
            out.append(part)
            total += len(part)
            unit = max(unit, start) + len(part)
        else:
            if out and total + len(payload) > max_bytes:
                break
            out.append(payload)
            total += len(payload)
            unit += 1
        if total >= max_bytes:
            break
    return out, unit


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and media_type(content_type) == JSON_TYPE


def _units(kind: int, payloads: list[bytes]) -> int:
    return sum(map(len, payloads)) if kind == KIND_BYTES else len(payloads)


__all__ = [
    "AppendRequest",
    "AppendResult",
    "BadRequest",
    "CreateRequest",
    "CreateResult",
    "ForkRequest",
    "ProducerHeaders",
    "ReadResult",
    "StreamStore",
]
