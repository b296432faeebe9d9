"""The ASGI application: stream routes on the hot path, Starlette for the rest.

Requests under the stream base path go straight to the protocol handlers;
health, readiness (and metrics) are small Starlette routes beside them. The
lifespan opens the store (running recovery) and closes it with a final
checkpoint; live reads are ended before that, as soon as the server begins to
stop (``end_live_reads``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from stream_server.auth import TokenAuth
from stream_server.config import Settings
from stream_server.engine import Engine
from stream_server.faults import hook_from_env
from stream_server.metrics import Metrics
from stream_server.protocol.handlers import Context, ProtocolSettings, StreamRoutes
from stream_server.protocol.http import Receive, Scope, Send, respond, text_headers
from stream_server.ratelimit import RateLimiter
from stream_server.streams.store import StoreEvents, StoreLimits, StreamStore

T = TypeVar("T")

log = logging.getLogger("stream_server")


class StreamServerApp:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics() if settings.metrics else None
        self.store = StreamStore(
            settings.data_dir,
            limits=StoreLimits(
                default_ttl=settings.default_ttl or None,
                max_streams=settings.max_streams or None,
                max_producers_per_stream=settings.max_producers_per_stream,
                max_fork_depth=settings.max_fork_depth,
                max_json_messages=settings.max_json_messages,
            ),
            events=self._events(),
            engine=Engine(
                settings.data_dir,
                map_size=settings.lmdb_map_size,
                fault_hook=hook_from_env(os.environ.get("DS_FAULT")),
            ),
        )
        auth = (
            TokenAuth.from_file(Path(settings.auth_tokens_file))
            if settings.auth_tokens_file
            else None
        )
        limiter = (
            RateLimiter(settings.rate_limit, settings.rate_burst)
            if settings.rate_limit > 0
            else None
        )
        self.streams = StreamRoutes(
            Context(
                self.store,
                same_named(ProtocolSettings, settings),
                self.metrics,
                auth=auth,
                limiter=limiter,
            )
        )
        self.base = settings.base_path
        self.base_bare = settings.base_path.rstrip("/")
        routes = [
            Route("/healthz", self.healthz, methods=["GET", "HEAD"]),
            Route("/readyz", self.readyz, methods=["GET", "HEAD"]),
        ]
        if self.metrics is not None:
            routes.append(Route("/metrics", self.metrics_endpoint, methods=["GET"]))
            self.metrics.bind(
                streams=lambda: len(self.store.streams),
                live=lambda mode: self.streams.live_readers[mode],
                data_dir=str(settings.data_dir),
                segment_bytes=lambda: sum(
                    t.file_len for t in list(self.store.engine.tails.values())
                ),
                ready=lambda: self.store.ready and not self.store.failed,
                failed=lambda: bool(self.store.failed),
            )
        self.web = Starlette(routes=routes, lifespan=self.lifespan)
        self.stopping = False
        # True when the HTTP protocol already refused heads past --max-header-bytes
        # and --max-headers (http_limits does): then they are not counted twice.
        self.headers_checked = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.headers_checked and self._headers_too_large(scope):
            await respond(
                send,
                431,
                text_headers([(b"connection", b"close")]),
                b"request headers too large or too many\n",
            )
            return
        if scope["type"] == "http" and scope["path"].startswith(self.base):
            if self.metrics is None:
                await self.streams(scope, receive, send)
            else:
                await self._measured(scope, receive, send)
        else:
            await self.web(scope, receive, send)

    def _headers_too_large(self, scope: Scope) -> bool:
        headers = scope["headers"]
        if len(headers) > self.settings.max_headers:
            return True
        return sum(len(k) + len(v) for k, v in headers) > self.settings.max_header_bytes

    async def _measured(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream requests with their method, status and duration recorded."""
        started = time.perf_counter()
        status = 500

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.streams(scope, receive, send_and_note)
        finally:
            assert self.metrics is not None
            self.metrics.on_request(scope["method"], status, time.perf_counter() - started)

    def _events(self) -> StoreEvents:
        m = self.metrics
        if m is None:
            return StoreEvents()

        def created(stream) -> None:
            m.streams_created.inc()
            if stream.meta.fork_from is not None:
                m.forks_created.inc()

        def failed(error) -> None:
            m.batch_failures.labels("disk_full" if error.disk_full else "error").inc()

        return StoreEvents(
            on_batch=m.on_batch,
            on_created=created,
            on_deleted=lambda path, reason: m.streams_deleted.labels(reason).inc(),
            on_producer=lambda event: m.producer_events.labels(event).inc(),
            on_failure=failed,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        report = await self.store.start()
        log.info(
            "recovery finished in %.3fs: %d streams, %d WAL frames replayed, "
            "%d streams trimmed (%d bytes), %d damaged, %d orphan files removed",
            report.seconds,
            report.streams,
            report.wal_frames_replayed,
            report.truncated_streams,
            report.truncated_bytes,
            len(report.damaged),
            report.orphan_files_removed,
        )
        for sid, reason in report.damaged.items():
            log.error("stream id %d is damaged and will not be served: %s", sid, reason)
        if self.metrics is not None:
            self.metrics.recovery_seconds.set(report.seconds)
            self.metrics.recovery_streams.set(report.streams)
            self.metrics.recovery_frames.set(report.wal_frames_replayed)
        log.info(
            "serving streams under %s from %s",
            self.settings.base_path,
            self.settings.data_dir,
            extra={
                "fields": {
                    "event": "recovery",
                    "seconds": report.seconds,
                    "streams": report.streams,
                    "wal_frames": report.wal_frames_replayed,
                    "trimmed_streams": report.truncated_streams,
                    "damaged": len(report.damaged),
                }
            },
        )
        try:
            yield
        finally:
            await self.store.stop()
            log.info("stopped cleanly")

    def end_live_reads(self) -> None:
        """Answer every long-poll as on its timeout and end every SSE response after
        its last control event, now and for live reads that arrive from here on.

        Called as soon as the server begins to stop: uvicorn waits for open
        responses before it runs the lifespan's shutdown, and a live read stays
        open until its timeout, so ending them there would be too late.
        """
        self.stopping = True
        live = sum(self.streams.live_readers.values())
        if live:
            log.info("shutting down: ending %d live reads", live)
        self.store.release_waiters()

    async def metrics_endpoint(self, request: Request) -> Response:
        assert self.metrics is not None
        # Scrape-time gauges stat the data directory: keep that off the event loop.
        body = await asyncio.to_thread(self.metrics.exposition)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def healthz(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok\n", headers={"cache-control": "no-store"})

    async def readyz(self, request: Request) -> JSONResponse:
        """Ready: recovery finished, storage has not failed closed, data dir writable."""
        problems = []
        if self.stopping:
            problems.append("shutting down")
        elif not self.store.ready:
            problems.append("recovery not finished")
        if self.store.failed:
            problems.append(f"storage failed closed: {self.store.failed}")
        if not await asyncio.to_thread(_writable, self.settings.data_dir):
            problems.append("data directory is not writable")
        body = {"ready": not problems, "problems": problems, "streams": len(self.store.streams)}
        return JSONResponse(
            body, status_code=503 if problems else 200, headers={"cache-control": "no-store"}
        )


def _writable(path) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=path, prefix=".probe-")
        os.close(fd)
        os.unlink(name)
        return True
    except OSError:
        return False


def create_app(settings: Settings | None = None) -> StreamServerApp:
    return StreamServerApp(settings or Settings())


def same_named(cls: type[T], settings: Settings) -> T:
    """``cls`` (a dataclass) with every field the settings also have taken from them,
    so that a setting added to both can never be left at the layer's own default."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{name: getattr(settings, name) for name in names if hasattr(settings, name)})
