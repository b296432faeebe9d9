"""Run the app under uvicorn (uvloop and httptools where installed)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import resource
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from stream_server.app import StreamServerApp, create_app
from stream_server.auth import AuthConfigError
from stream_server.config import Settings
from stream_server.engine import LayoutError
from stream_server.fencing import FencedApp, FenceWatch, fenced_at_start, restart_process
from stream_server.logs import configure
from stream_server.rotation import FileWatcher, RotatingTls, Watched, token_loader

log = logging.getLogger("stream_server")

# Descriptors kept for the server's own files when the connection cap is derived:
# up to 256 open segments, LMDB, the WAL, reader threads, logs.
FILE_RESERVE = 512
MIN_CONNECTIONS = 16
# Shutdown: connections still busy ABORT_AFTER seconds after it began are reset, so
# their requests finish (a send to a reset connection returns at once) before
# uvicorn cancels what is left at SHUTDOWN_GRACE, well inside a pod's grace period.
ABORT_AFTER = 3.0
SHUTDOWN_GRACE = 5  # seconds (uvicorn takes an int)


# The collector's thresholds in the server process. In a fill of 100k creates and 100k
# appends, CPython's (700, 10, 10) ran 69 full collections of up to 160 ms each, the
# event loop stopped meanwhile (each append makes a stream's new tail and loads or
# drops streams); these run none, with young pauses of up to 56 ms, and hold at most
# about 100k objects of garbage (``python e2e/bench/gc_pauses.py`` prints both). What
# the start built is frozen as well (``BackgroundRecovery.freeze_gc``).
GC_THRESHOLDS = (10_000, 10, 100)


def serve(settings: Settings) -> int:
    log_config = configure(settings.log_level, settings.log_format)
    gc.set_threshold(*GC_THRESHOLDS)
    if fenced_at_start(settings.fence_file):
        return serve_fenced(settings, log_config)
    from stream_format.layout import Layout
    from stream_server.engine.data_dir import prepare

    try:
        prepare(Layout(settings.data_dir))
        app = create_app(settings)
        app.recovery.freeze_gc = True
    except (LayoutError, AuthConfigError) as exc:
        log.error("%s", exc)
        return 2
    http, limit_concurrency = http_protocol(settings)
    app.headers_checked = not isinstance(http, str)  # http_limits checks them exactly
    tls = RotatingTls() if settings.tls_cert else None
    config = _uvicorn_config(
        app,
        settings,
        log_config,
        http=http,
        ssl_context_factory=tls.factory if tls else None,
        limit_concurrency=limit_concurrency,
        timeout_keep_alive=settings.keep_alive_timeout,
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )
    server = StreamServer(config, app, watcher=file_watcher(settings, app, tls))
    if settings.fence_file:
        server.fence = FenceWatch(settings.fence_file, False, server.fence_now)
    server.run()
    if server.fence is not None and server.fence.requested:
        restart_process()  # fenced: the store is closed, the process starts again fenced
    failure = app.recovery.error
    if failure is not None:
        return 2 if isinstance(failure, LayoutError) else 1
    return 0 if server.started and app.stopped_cleanly else 1


def _uvicorn_config(
    app: Any, settings: Settings, log_config: dict[str, Any] | None, **extra: Any
) -> uvicorn.Config:
    """What the served app and the fenced one share: address, TLS files, shutdown grace."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        lifespan="on",
        access_log=False,
        log_config=log_config,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        server_header=False,
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
        **extra,
    )


def serve_fenced(settings: Settings, log_config: dict[str, Any] | None) -> int:
    """Serve fenced (``fencing.FencedApp``): the data directory is not opened at all.
    When the fence is lifted, the process starts again as an ordinary server."""
    log.warning(
        "fenced by %s: not opening %s; /healthz answers, /readyz and the rest 503",
        settings.fence_file,
        settings.data_dir,
    )
    config = _uvicorn_config(FencedApp(settings.fence_file), settings, log_config)
    server = FencedServer(config)
    server.fence = FenceWatch(settings.fence_file, True, server.lift)
    server.run()
    if server.fence.requested:
        restart_process()
    return 0 if server.started else 1


class ExitStatusServer(uvicorn.Server):
    """Uvicorn's server, whose stop on SIGTERM or SIGINT ends in ``serve``'s exit status.

    Uvicorn re-raises the signals it handled once it has stopped, to "trigger the
    expected behaviour": the process then died of SIGTERM (status -15, after logging
    "stopped cleanly") or raised KeyboardInterrupt with a traceback. A supervisor
    would take every clean stop for a crash; ``serve`` returns the status instead.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()  # handled: not raised again


class FencedServer(ExitStatusServer):
    """Uvicorn's server for ``FencedApp``, watching for the fence to be lifted."""

    fence: FenceWatch

    def lift(self) -> None:
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.fence.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.fence.stop()
        await super().shutdown(sockets)


def file_watcher(
    settings: Settings, app: StreamServerApp, tls: RotatingTls | None
) -> FileWatcher | None:
    """What ``rotation`` reloads: the TLS certificate and key, and the token file."""
    watched = []
    if tls is not None:
        paths = (settings.tls_cert, settings.tls_key)
        watched.append(Watched("TLS certificate", paths, tls.load))
    if app.auth is not None:
        path = settings.auth_tokens_file
        watched.append(Watched("token file", (path,), token_loader(app.auth, Path(path))))
    return FileWatcher(watched, settings.reload_interval) if watched else None


class StreamServer(ExitStatusServer):
    """Uvicorn's server, which ends live reads the moment shutdown begins and, in a
    replica set, hands a primary's Lease to a standby before it stops listening.

    Uvicorn closes idle connections, then waits for busy ones (up to its
    graceful timeout) and only then runs the app's lifespan shutdown. A
    long-poll or SSE reader is busy until its timeout, so without this every
    stop would wait out the graceful timeout and cancel the readers mid-wait,
    each with a ``CancelledError`` traceback.
    """

    def __init__(
        self, config: uvicorn.Config, app: StreamServerApp, watcher: FileWatcher | None = None
    ) -> None:
        super().__init__(config)
        self.stream_app = app
        self.watcher = watcher
        self.fence: FenceWatch | None = None  # the fence file's watch (fencing.py)
        app.on_fatal = self._stop  # recovery failed

    def _stop(self) -> None:
        self.should_exit = True

    def fence_now(self) -> None:
        """The fence file says fenced: stop as on SIGTERM (``serve`` then starts again)."""
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.watcher is not None and self.started:
            self.watcher.start()
        if self.fence is not None and self.started:
            self.fence.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
        if self.fence is not None:
            await self.fence.stop()
        self.stream_app.end_live_reads()
        await self.stream_app.hand_over()
        backstop = asyncio.get_running_loop().call_later(ABORT_AFTER, self._abort_busy)
        try:
            await super().shutdown(sockets)
        finally:
            backstop.cancel()

    def _abort_busy(self) -> None:
        """Reset the connections still open: a response the client does not read
        (or a request it does not finish sending) must not hold the process."""
        busy = [c for c in self.server_state.connections if hasattr(c, "abort")]
        if busy:
            log.warning("shutting down: resetting %d connections still busy", len(busy))
        for connection in busy:
            connection.abort()


def http_protocol(settings: Settings) -> tuple[type[asyncio.Protocol] | str, int | None]:
    """Uvicorn's ``http=`` and ``limit_concurrency``: the httptools protocol with the
    connection-level limits (``http_limits``), or h11 with what it offers."""
    open_files = raise_open_file_limit()
    cap = connection_cap(settings.max_connections, open_files)
    try:
        from stream_server.http_limits import protocol_class
    except ImportError:  # no httptools: uvicorn's h11 protocol
        log.warning(
            "httptools is not installed: serving with h11, without the header deadline; "
            "headers are limited to %d bytes and requests past %d connections get 503",
            settings.max_header_bytes,
            cap,
        )
        return "h11", cap
    log.info("serving at most %d connections (open-file limit %d)", cap, open_files)
    return protocol_class(settings, cap), None


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one, and return the soft limit.

    The soft limit is often a historical 1024 while the hard one is far higher;
    a server that holds one descriptor per client should use what it may.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft if soft != resource.RLIM_INFINITY else target
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft
    return target


def connection_cap(configured: int, open_files: int) -> int:
    """``--max-connections``, or with 0 what the open-file limit leaves for clients.

    A reserve of ``FILE_RESERVE`` or a quarter of the limit, whichever is
    larger, stays for the server's own files; under a small limit clients get
    at least half of it, and never fewer than ``MIN_CONNECTIONS``.
    """
    if configured > 0:
        return configured
    cap = open_files - max(FILE_RESERVE, open_files // 4)
    return max(cap, open_files // 2, MIN_CONNECTIONS)
