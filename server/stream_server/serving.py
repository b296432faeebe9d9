"""Uvicorn's servers as this program runs them: the exit status, the order of a stop
(live reads ended, a primary's hand-over, busy connections reset), the connection cap
from the open-file limit, and the files reloaded while serving. ``server.py`` decides
which process serves what with them; ``workers/processes.py`` runs the writer and its
workers with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import resource
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import uvicorn

from stream_server.auth import TokenAuth
from stream_server.config import Settings
from stream_server.fencing import FenceWatch
from stream_server.listen import listen_socket
from stream_server.rotation import FileWatcher, RotatingTls, Watched, token_loader

log = logging.getLogger("stream_server")

# The collector's thresholds in every process of the server, a worker's too. In a fill
# of 100k creates and 100k appends, CPython's (700, 10, 10) ran 69 full collections of
# up to 160 ms each, the event loop stopped meanwhile (each append makes a stream's new
# tail and loads or drops streams); these run none, with young pauses of up to 56 ms,
# and hold at most about 100k objects of garbage (``python e2e/bench/gc_pauses.py``
# prints both). What the start built is frozen as well (``BackgroundRecovery.freeze_gc``;
# a worker's, in ``serve_worker``).
GC_THRESHOLDS = (10_000, 10, 100)

# Descriptors kept for the server's own files when the connection cap is derived:
# up to 256 open segments, LMDB, the WAL, reader threads, logs.
FILE_RESERVE = 512


MIN_CONNECTIONS = 16


# Shutdown: connections still busy ABORT_AFTER seconds after it began are reset, so
# their requests finish (a send to a reset connection returns at once) before
# uvicorn cancels what is left at SHUTDOWN_GRACE, well inside a pod's grace period.
ABORT_AFTER = 3.0


SHUTDOWN_GRACE = 5  # seconds (uvicorn takes an int)


def uvicorn_config(
    app: Any,
    settings: Settings,
    log_config: dict[str, Any] | None,
    *,
    listen: bool = True,
    **extra: Any,
) -> uvicorn.Config:
    """What every server of ours shares: the loop, the lifespan, logs, the shutdown grace;
    with ``listen``, the address and TLS files (a writer under workers listens on its own
    Unix socket instead, given in ``extra``)."""
    if listen:
        extra.update(
            host=settings.host,
            port=settings.port,
            ssl_certfile=settings.tls_cert or None,
            ssl_keyfile=settings.tls_key or None,
        )
    return uvicorn.Config(
        app,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        lifespan="on",
        access_log=False,
        log_config=log_config,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        server_header=False,
        **extra,
    )


def public_config(
    app: Any, settings: Settings, log_config: dict[str, Any] | None
) -> tuple[uvicorn.Config, RotatingTls | None]:
    """The config of a server on the public port (a single process, or a worker): the
    connection limits of ``http_limits``, TLS that reloads, keep-alive and head limits."""
    http, limit_concurrency = http_protocol(settings)
    tls = RotatingTls() if settings.tls_cert else None
    config = uvicorn_config(
        app,
        settings,
        log_config,
        http=http,
        ssl_context_factory=tls.factory if tls else None,
        limit_concurrency=limit_concurrency,
        timeout_keep_alive=settings.keep_alive_timeout,
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )
    return config, tls


class ExitStatusServer(uvicorn.Server):
    """Uvicorn's server, whose stop on SIGTERM or SIGINT ends in ``serve``'s exit status.

    Uvicorn re-raises the signals it handled once it has stopped, to "trigger the
    expected behaviour": the process then died of SIGTERM (status -15, after logging
    "stopped cleanly") or raised KeyboardInterrupt with a traceback. A supervisor
    would take every clean stop for a crash; ``serve`` returns the status instead.
    """

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve; a server on the public port binds it first, before the app starts: a
        port in use or an address not this machine's raises ``CannotListen`` naming the
        setting, where uvicorn logged it after the app's start, ran its shutdown and
        exited 3."""
        config = self.config
        if sockets is None and config.uds is None and config.fd is None:
            sock = listen_socket(config.host, config.port)
            address = sock.getsockname()
            log.info("listening on %s port %d", address[0], address[1])
            sockets = [sock]
        super().run(sockets=sockets)

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
    settings: Settings, auth: TokenAuth | None, tls: RotatingTls | None
) -> FileWatcher | None:
    """What ``rotation`` reloads: the TLS certificate and key, and the token file."""
    watched = []
    if tls is not None:
        paths = (settings.tls_cert, settings.tls_key)
        watched.append(Watched("TLS certificate", paths, tls.load))
    if auth is not None:
        path = settings.auth_tokens_file
        watched.append(Watched("token file", (path,), token_loader(auth, Path(path))))
    return FileWatcher(watched, settings.reload_interval) if watched else None


class ServedApp(Protocol):
    """What ``StreamServer`` asks of the app it serves (``StreamServerApp``, or a
    worker's ``WorkerApp``)."""

    on_fatal: Callable[[], None] | None

    def end_live_reads(self) -> None: ...

    async def hand_over(self) -> None: ...


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
        self, config: uvicorn.Config, app: ServedApp, watcher: FileWatcher | None = None
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
