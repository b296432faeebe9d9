"""One handler per protocol operation, and the mapping of refusals to responses."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass

import orjson

from stream_format.offsets import NOW, START, OffsetError, format_offset, parse_offset
from stream_server.auth import Denied, TokenAuth
from stream_server.metrics import Metrics
from stream_server.protocol import sse
from stream_server.protocol.cursor import next_cursor
from stream_server.protocol.headers import (
    is_true,
    non_negative_int,
    parse_expires_at,
    parse_producer,
    parse_ttl,
)
from stream_server.protocol.http import (
    COMMON,
    PREFLIGHT,
    Headers,
    PayloadTooLarge,
    Receive,
    RequestTimeout,
    Scope,
    Send,
    query_params,
    read_body,
    request_headers,
    respond,
    text_headers,
)
from stream_server.protocol.live import Hangup, ReaderSlots, TooManyRequests
from stream_server.protocol.paths import is_reserved, stream_path
from stream_server.ratelimit import RateLimiter, retry_after
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
    TooLarge,
    Unavailable,
)
from stream_server.streams.model import Stream
from stream_server.streams.store import (
    AppendRequest,
    CreateRequest,
    ForkRequest,
    ReadResult,
    StreamStore,
)

log = logging.getLogger("stream_server.protocol")

CACHE_READ = b"public, max-age=60, stale-while-revalidate=300"
# With auth on, a shared cache must not hand one client's stream to another (section 10.1).
CACHE_READ_PRIVATE = b"private, max-age=60, stale-while-revalidate=300"
CACHE_NONE = b"no-store"
# A catch-up read holds at most this much in memory at once; larger binary responses
# are streamed in chunks of this size (JSON responses stop at it).
READ_CHUNK_BYTES = 4 * 1024 * 1024
TRUE = b"true"


@dataclass
class ProtocolSettings:
    base_path: str = "/v1/stream/"
    long_poll_timeout: float = 30.0
    sse_reconnect_interval: float = 60.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_read_bytes: int = 64 * 1024 * 1024
    max_path_bytes: int = 1024
    max_segment_bytes: int = 255
    slow_append_seconds: float = 1.0
    max_live_readers: int = 10000
    max_live_readers_per_client: int = 0  # 0: a tenth of max_live_readers
    body_timeout: float = 30.0
    min_body_rate: int = 1024  # bytes/s a body must average after body_timeout (0: off)


class StreamRoutes:
    """The ASGI app for everything below the stream base path."""

    def __init__(
        self,
        store: StreamStore,
        settings: ProtocolSettings,
        metrics: Metrics | None = None,
        *,
        auth: TokenAuth | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.auth = auth
        self.limiter = limiter
        self.base = settings.base_path.encode()
        per_client = settings.max_live_readers_per_client or max(1, settings.max_live_readers // 10)
        self.slots = ReaderSlots(settings.max_live_readers, per_client)
        self.live_readers = self.slots.by_mode  # read by the metrics gauge
        self.cache_read = CACHE_READ if auth is None else CACHE_READ_PRIVATE
        # What one read holds in memory: JSON and live responses stop at it.
        self.read_chunk = min(settings.max_read_bytes, READ_CHUNK_BYTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        send = self._bounded(scope, send)
        headers = request_headers(scope)
        client = (scope.get("client") or ("?", 0))[0]
        try:
            path = stream_path(
                raw_path(scope),
                self.base,
                max_bytes=self.settings.max_path_bytes,
                max_segment=self.settings.max_segment_bytes,
            )
            if method == "OPTIONS":
                await respond(send, 204, list(PREFLIGHT))
                return
            if self.auth is not None or self.limiter is not None:
                client, refusal = self._admit(client, method, path, headers)
                if refusal is not None:
                    await respond(send, *refusal)
                    return
            if is_reserved(path):
                await respond(
                    send,
                    501,
                    text_headers(),
                    b"subscriptions (the __ds paths) are not implemented\n",
                )
                return
            if method == "GET":
                await self.get(scope, receive, send, path, headers, client)
            elif method == "POST":
                await self.post(receive, send, path, headers)
            elif method == "PUT":
                await self.put(scope, receive, send, path, headers)
            elif method == "HEAD":
                await self.head(send, path)
            elif method == "DELETE":
                await self.store.delete(path)
                await respond(send, 204, [])
            else:
                await respond(
                    send,
                    405,
                    text_headers([(b"allow", b"GET, HEAD, POST, PUT, DELETE, OPTIONS")]),
                    b"method not allowed\n",
                )
        except StreamError as exc:
            await respond(send, *error_response(exc))
        except (ConnectionAbortedError, OSError):
            return

    def _bounded(self, scope: Scope, send: Send) -> Send:
        """A send that gives up on a client that stops reading, and drops the connection.

        Only streamed and large bodies can block on a full socket buffer; small
        complete responses are buffered by the transport at once, so they skip
        the timer (a streamed response's last, empty send does not). On a timeout the transport is aborted (when the server
        provides ``stream_server.abort``): closing it gracefully would keep the
        unread megabytes buffered until the client read them, which it never will.
        """
        timeout = self.settings.body_timeout
        abort = scope.get("extensions", {}).get("stream_server.abort")
        streamed = False

        async def bounded(message) -> None:
            nonlocal streamed
            if message["type"] != "http.response.body" or not (
                streamed or message.get("more_body") or len(message.get("body", b"")) >= 65536
            ):
                await send(message)
                return
            streamed = True
            try:
                async with asyncio.timeout(timeout):
                    await send(message)
            except TimeoutError:
                if abort is not None:
                    abort()
                raise ConnectionAbortedError("client stopped reading") from None

        return bounded

    def _admit(
        self, client: str, method: str, path: str, h: dict[str, str]
    ) -> tuple[str, tuple[int, Headers, bytes] | None]:
        """Authentication, authorisation and rate limiting: the client's name, and a refusal.

        A failed authentication costs the address a request of its rate like any
        other, so guessing tokens is as slow as the rate limit makes it.
        """
        if self.auth is not None:
            source = h.get("stream-forked-from") if method == "PUT" else None
            try:
                principal = self.auth.check(
                    h.get("authorization"),
                    method,
                    path,
                    self._source_path(source) if source else None,
                )
            except Denied as exc:
                limited = self._rate_limited(client) if exc.status == 401 else None
                if limited is not None:
                    return client, limited
                extra: Headers = []
                if exc.status == 401:
                    extra = [(b"www-authenticate", b'Bearer realm="durable-streams"')]
                return client, (exc.status, text_headers(extra), (exc.reason + "\n").encode())
            client = "token:" + principal.name
        return client, self._rate_limited(client)

    def _rate_limited(self, client: str) -> tuple[int, Headers, bytes] | None:
        if self.limiter is None:
            return None
        wait = self.limiter.acquire(client)
        if wait <= 0:
            return None
        return (
            429,
            text_headers([(b"retry-after", retry_after(wait).encode())]),
            b"rate limit exceeded\n",
        )

    # ------------------------------------------------------------------- PUT

    async def put(
        self, scope: Scope, receive: Receive, send: Send, path: str, h: dict[str, str]
    ) -> None:
        ttl = parse_ttl(h.get("stream-ttl"))
        expires = parse_expires_at(h.get("stream-expires-at"))
        if ttl is not None and expires is not None:
            raise BadRequest("send Stream-TTL or Stream-Expires-At, not both")
        fork = None
        source = h.get("stream-forked-from")
        if source is not None:
            fork = ForkRequest(self._source_path(source), None)
            raw_offset = h.get("stream-fork-offset")
            if raw_offset is not None:
                fork.offset = self._unit(raw_offset.strip(), allow_now=False)
                if fork.offset == START:
                    fork.offset = 0
            sub = h.get("stream-fork-sub-offset")
            if sub is not None:
                fork.sub_offset = non_negative_int(sub.strip(), "Stream-Fork-Sub-Offset")
        elif "stream-fork-offset" in h or "stream-fork-sub-offset" in h:
            raise BadRequest("Stream-Fork-Offset needs Stream-Forked-From")
        body = await read_body(
            receive,
            self.settings.max_body_bytes,
            h.get("content-length"),
            self.settings.body_timeout,
            self.settings.min_body_rate,
        )
        result = await self.store.create(
            CreateRequest(
                path=path,
                content_type=_content_type(h),
                body=body,
                ttl=ttl,
                expires_at=expires[0] if expires else None,
                expires_at_ts=expires[1] if expires else None,
                closed=is_true(h.get("stream-closed")),
                fork=fork,
            )
        )
        s = result.stream
        hs: Headers = [
            (b"content-type", s.meta.content_type.encode()),
            (b"stream-next-offset", format_offset(result.tail).encode()),
            (b"cache-control", CACHE_NONE),
        ]
        if result.closed:
            hs.append((b"stream-closed", TRUE))
        if result.created:
            hs.append((b"location", _absolute_url(scope, h, raw_path(scope)).encode()))
        await respond(send, 201 if result.created else 200, hs)

    def _source_path(self, value: str) -> str:
        """Stream-Forked-From names a path on this server: full URL path or stream path."""
        raw = value.strip().encode()
        if raw.startswith(self.base):
            return stream_path(
                raw,
                self.base,
                max_bytes=self.settings.max_path_bytes,
                max_segment=self.settings.max_segment_bytes,
            )
        return stream_path(
            self.base + raw.lstrip(b"/"),
            self.base,
            max_bytes=self.settings.max_path_bytes,
            max_segment=self.settings.max_segment_bytes,
        )

    # ------------------------------------------------------------------ POST

    async def post(self, receive: Receive, send: Send, path: str, h: dict[str, str]) -> None:
        started = time.perf_counter()
        producer = parse_producer(
            h.get("producer-id"), h.get("producer-epoch"), h.get("producer-seq")
        )
        seq = h.get("stream-seq")
        body = await read_body(
            receive,
            self.settings.max_body_bytes,
            h.get("content-length"),
            self.settings.body_timeout,
            self.settings.min_body_rate,
        )
        result = await self.store.append(
            AppendRequest(
                path=path,
                content_type=_content_type(h),
                body=body,
                stream_seq=seq,
                producer=producer,
                close=is_true(h.get("stream-closed")),
            )
        )
        if result.appended or result.batch is not None:
            self._observe_append(path, started, result.batch)
        hs: Headers = [(b"stream-next-offset", format_offset(result.tail).encode())]
        if result.closed:
            hs.append((b"stream-closed", TRUE))
        status = 204
        if result.producer is not None:
            hs.append((b"producer-epoch", str(result.producer.epoch).encode()))
            hs.append((b"producer-seq", str(result.producer.seq).encode()))
            status = 200 if result.appended else 204
        await respond(send, status, hs)

    def _observe_append(self, path: str, started: float, batch) -> None:
        elapsed = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.append_seconds.observe(elapsed)
        if elapsed >= self.settings.slow_append_seconds:
            split = {
                "seconds": round(elapsed, 6),
                "write_seconds": round(batch.write_seconds, 6) if batch else None,
                "fsync_seconds": round(batch.fsync_seconds, 6) if batch else None,
                "commit_seconds": round(batch.commit_seconds, 6) if batch else None,
                "batch_appends": batch.appends if batch else None,
            }
            if self.metrics is not None:
                self.metrics.slow_appends.inc()
            log.warning(
                "slow append to %s: %.3fs (write %ss, fsync %ss, commit %ss)",
                path,
                elapsed,
                split["write_seconds"],
                split["fsync_seconds"],
                split["commit_seconds"],
                extra={"fields": {"event": "slow_append", "stream": path, **split}},
            )

    # ------------------------------------------------------------------ HEAD

    async def head(self, send: Send, path: str) -> None:
        s = self.store.get(path)
        await respond(send, 200, [*self._meta_headers(s, s.tail), (b"cache-control", CACHE_NONE)])

    def _meta_headers(self, s: Stream, next_unit: int) -> Headers:
        hs: Headers = [
            (b"content-type", s.meta.content_type.encode()),
            (b"stream-next-offset", format_offset(next_unit).encode()),
        ]
        if s.meta.ttl is not None:
            hs.append((b"stream-ttl", str(s.meta.ttl).encode()))
        if s.meta.expires_at is not None:
            hs.append((b"stream-expires-at", s.meta.expires_at.encode()))
        if s.meta.closed and next_unit >= s.tail:
            hs.append((b"stream-closed", TRUE))
        return hs

    # ------------------------------------------------------------------- GET

    async def get(
        self, scope: Scope, receive: Receive, send: Send, path: str, h: dict[str, str], client: str
    ) -> None:
        q = query_params(scope)
        live = q.get("live")
        if live not in (None, "long-poll", "sse"):
            raise BadRequest("live must be 'long-poll' or 'sse'")
        raw_offset = q.get("offset")
        if live is not None and raw_offset is None:
            raise BadRequest("live reads need an offset")
        offset = START if raw_offset is None else self._unit(raw_offset)
        s = self.store.get(path, touch=True)
        if offset == START:
            unit = 0
        elif offset == NOW:
            unit = s.tail
        else:
            unit = offset
            if unit > s.tail:
                raise BadRequest("offset is past the end of the stream")
        if live is not None:
            with self.slots.hold(live, client):
                hangup = Hangup(receive)
                try:
                    if live == "sse":
                        await self._sse(send, s, unit, q.get("cursor"), hangup)
                    else:
                        await self._long_poll(send, s, unit, h, q.get("cursor"), hangup)
                finally:
                    hangup.close()
            return
        if offset == NOW and live is None:
            await self._send_read(
                send,
                s,
                ReadResult([], unit, unit, s.tail, s.meta.closed),
                h,
                etag=False,
                cache=CACHE_NONE,
            )
            return
        if not s.is_json and s.tail - unit > self.read_chunk:
            await self._send_streamed_read(send, s, unit, h)
            return
        result = await self.store.read(s, unit, self.read_chunk)
        self._observe_read(result)
        await self._send_read(send, s, result, h)

    async def _send_streamed_read(
        self, send: Send, s: Stream, unit: int, h: dict[str, str]
    ) -> None:
        """A large binary catch-up in one response, sent in chunks as they are read.

        Binary offsets count bytes, so the response's end offset and length are
        known before anything is read; the next chunk is read (off the loop)
        while the previous one is being sent. Committed bytes never change, so
        streaming them is as consistent as one read.
        """
        stop = min(s.tail, unit + self.settings.max_read_bytes)
        promised = ReadResult([], unit, stop, s.tail, s.meta.closed and stop >= s.tail)
        hs, not_modified = self._read_headers(s, promised, h, etag=True)
        if not_modified:
            await respond(send, 304, hs)
            return
        hs = [*COMMON, *hs, (b"content-length", str(stop - unit).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": hs})
        cur = unit
        pending = asyncio.ensure_future(self.store.read(s, cur, min(READ_CHUNK_BYTES, stop - cur)))
        try:
            while cur < stop:
                chunk = await pending
                self._observe_read(chunk)
                if chunk.next <= cur:
                    raise ConnectionAbortedError(f"stream {s.path} ended early mid-response")
                cur = chunk.next
                if cur < stop:
                    pending = asyncio.ensure_future(
                        self.store.read(s, cur, min(READ_CHUNK_BYTES, stop - cur))
                    )
                body = b"".join(chunk.payloads)
                await send({"type": "http.response.body", "body": body, "more_body": cur < stop})
        except StreamError as exc:
            # The status is already sent: all that is left is to cut the response short.
            log.warning("catch-up of %s cut short: %s", s.path, exc)
            raise ConnectionAbortedError(str(exc)) from None
        finally:
            pending.cancel()

    def _observe_read(self, result: ReadResult) -> None:
        if self.metrics is not None:
            size = sum(map(len, result.payloads))
            self.metrics.read_size.observe(size)
            self.metrics.read_bytes.inc(size)

    async def _long_poll(
        self,
        send: Send,
        s: Stream,
        unit: int,
        h: dict[str, str],
        cursor: str | None,
        hangup: Hangup,
    ) -> None:
        if s.tail <= unit and not s.meta.closed:
            await self.store.wait(s, unit, self.settings.long_poll_timeout, hangup.future)
            if hangup.happened:
                return
            s = self.store.get(s.path)
        if s.tail <= unit:
            hs: Headers = [
                (b"stream-next-offset", format_offset(s.tail).encode()),
                (b"stream-up-to-date", TRUE),
                (b"cache-control", CACHE_NONE),
            ]
            if s.meta.closed:
                hs.append((b"stream-closed", TRUE))
            else:
                hs.append((b"stream-cursor", next_cursor(cursor).encode()))
            await respond(send, 204, hs)
            return
        result = await self.store.read(s, unit, self.read_chunk)
        self._observe_read(result)
        await self._send_read(send, s, result, h, cursor=next_cursor(cursor))

    def _read_headers(
        self,
        s: Stream,
        r: ReadResult,
        h: dict[str, str],
        *,
        etag: bool,
        cache: bytes | None = None,
        cursor: str | None = None,
    ) -> tuple[Headers, bool]:
        """The headers of a read answered with ``r``, and whether the client's ETag matches."""
        hs: Headers = [
            (b"content-type", s.meta.content_type.encode()),
            (b"stream-next-offset", format_offset(r.next).encode()),
            (b"cache-control", cache or self.cache_read),
        ]
        if self.auth is not None:
            hs.append((b"vary", b"authorization"))
        if r.up_to_date:
            hs.append((b"stream-up-to-date", TRUE))
        if r.closed:
            hs.append((b"stream-closed", TRUE))
        if cursor is not None and not r.closed:
            hs.append((b"stream-cursor", cursor.encode()))
        if etag:
            tag = f'"{s.id}:{format_offset(r.start)}:{format_offset(r.next)}{":c" if r.closed else ""}"'
            hs.append((b"etag", tag.encode()))
            return hs, _etag_matches(h.get("if-none-match"), tag)
        return hs, False

    async def _send_read(
        self,
        send: Send,
        s: Stream,
        r: ReadResult,
        h: dict[str, str],
        *,
        etag: bool = True,
        cache: bytes | None = None,
        cursor: str | None = None,
    ) -> None:
        hs, not_modified = self._read_headers(s, r, h, etag=etag, cache=cache, cursor=cursor)
        if not_modified:
            await respond(send, 304, hs)
            return
        if s.is_json:
            body = json_array(r.payloads)
        else:
            body = r.payloads[0] if len(r.payloads) == 1 else b"".join(r.payloads)
        await respond(send, 200, hs, body)

    # ------------------------------------------------------------------- SSE

    async def _sse(
        self, send: Send, s: Stream, unit: int, cursor: str | None, hangup: Hangup
    ) -> None:
        text = s.is_json or s.meta.content_type.lower().startswith("text/")
        hs: Headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        if not text:
            hs.append((b"stream-sse-data-encoding", b"base64"))
        await send({"type": "http.response.start", "status": 200, "headers": [*COMMON, *hs]})
        deadline = time.monotonic() + self.settings.sse_reconnect_interval
        try:
            while True:
                result = await self.store.read(s, unit, self.read_chunk)
                if self.metrics is not None:
                    self.metrics.read_bytes.inc(sum(map(len, result.payloads)))
                chunks: list[bytes] = []
                if result.payloads:
                    if s.is_json:
                        chunks.append(sse.data_event_text(json_array(result.payloads)))
                    elif text:
                        chunks.append(sse.data_event_text(b"".join(result.payloads)))
                    else:
                        chunks.append(
                            sse.data_event_raw(base64.b64encode(b"".join(result.payloads)))
                        )
                unit = result.next
                closed = s.meta.closed and unit >= s.tail
                control: dict = {"streamNextOffset": format_offset(unit)}
                if closed:
                    control["streamClosed"] = True
                    control["upToDate"] = True
                else:
                    cursor = next_cursor(cursor)
                    control["streamCursor"] = cursor
                    if unit >= s.tail:
                        control["upToDate"] = True
                chunks.append(sse.control_event(orjson.dumps(control)))
                await send(
                    {"type": "http.response.body", "body": b"".join(chunks), "more_body": True}
                )
                if closed:
                    break
                if unit < s.tail:
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await self.store.wait(s, unit, remaining, hangup.future)
                if hangup.happened:
                    return
                current = self.store.streams.get(s.path)
                if current is not s or s.pmeta.soft_deleted:
                    break  # deleted while we waited
                if s.tail <= unit and not s.meta.closed:
                    break  # reconnect interval reached
        except StreamError as exc:
            log.debug("SSE ended: %s", exc)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # ------------------------------------------------------------------ misc

    def _unit(self, value: str, *, allow_now: bool = True) -> int:
        try:
            return parse_offset(value, allow_now=allow_now)
        except OffsetError as exc:
            raise BadRequest(str(exc)) from None


def json_array(messages: list) -> bytes:
    """``[m1,m2,...]`` with a single copy of the message bytes."""
    if not messages:
        return b"[]"
    parts = [b"["]
    for m in messages:
        parts.append(m)
        parts.append(b",")
    parts[-1] = b"]"
    return b"".join(parts)


def raw_path(scope: Scope) -> bytes:
    return scope.get("raw_path") or scope["path"].encode()


def _absolute_url(scope: Scope, h: dict[str, str], path: bytes) -> str:
    host = h.get("host")
    if host is None:
        server = scope.get("server") or ("localhost", None)
        host = server[0] if server[1] is None else f"{server[0]}:{server[1]}"
    return f"{scope.get('scheme', 'http')}://{host}{path.decode('latin-1')}"


def _content_type(h: dict[str, str]) -> str | None:
    ct = h.get("content-type")
    if ct is None:
        return None
    ct = ct.strip()
    return ct or None


def _etag_matches(header: str | None, tag: str) -> bool:
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(part.strip().removeprefix("W/") == tag for part in header.split(","))


def error_response(exc: StreamError) -> tuple[int, Headers, bytes]:
    """Status, headers and a short plain-text reason for a refused operation."""
    extra: Headers = []
    if isinstance(exc, StreamClosed):
        status = 409
        extra = [
            (b"stream-closed", TRUE),
            (b"stream-next-offset", format_offset(exc.final_unit).encode()),
        ]
    elif isinstance(exc, SequenceGap):
        status = 409
        extra = [
            (b"producer-expected-seq", str(exc.expected).encode()),
            (b"producer-received-seq", str(exc.received).encode()),
        ]
    elif isinstance(exc, ProducerFenced):
        status = 403
        extra = [(b"producer-epoch", str(exc.current_epoch).encode())]
    elif isinstance(exc, Conflict):
        status = 409
    elif isinstance(exc, BadRequest):
        status = 400
    elif isinstance(exc, NotFound):
        status = 404
    elif isinstance(exc, Gone):
        status = 410
    elif isinstance(exc, PayloadTooLarge | TooLarge):
        status = 413
    elif isinstance(exc, TooManyRequests):
        status = 429
        extra = [(b"retry-after", b"1")]
    elif isinstance(exc, RequestTimeout):
        status = 408
        extra = [(b"connection", b"close")]
    elif isinstance(exc, Unavailable):
        status = 507 if exc.disk_full else 503
        extra = [(b"retry-after", b"5" if exc.disk_full else b"1")]
    elif isinstance(exc, Damaged):
        status = 500
    else:
        status = 500
    return status, text_headers(extra), (exc.message + "\n").encode()


__all__ = ["ProtocolSettings", "StreamRoutes"]
