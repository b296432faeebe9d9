"""The two kinds of process of a server with ``--workers N`` (N > 1), under uvicorn.

The writer is the process started by the user (or the pod): it opens the data
directory, binds the port and hands it to its workers, serves its own app on a
Unix socket (what workers relay) and answers the workers' store calls on
another (``WriterHost``). Each worker serves ``WorkerApp`` on the inherited port.
At shutdown the workers stop first, finishing their requests while the writer can
still commit them; then the writer stops as a single process does (live reads
ended, a primary's hand-over, the final checkpoint).
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import uvicorn

from stream_server.app import StreamServerApp
from stream_server.listen import (
    PORT_FILE,
    RUNTIME_PREFIX,
    listen_socket,
    remove_stale_runtimes,
)
from stream_server.logs import configure
from stream_server.rotation import FileWatcher
from stream_server.serving import (
    GC_THRESHOLDS,
    SHUTDOWN_GRACE,
    StreamServer,
    file_watcher,
    http_protocol,
    public_config,
    uvicorn_config,
)
from stream_server.workers.host import WriterHost
from stream_server.workers.proxy import WriterProxy
from stream_server.workers.supervisor import (
    FD_ENV,
    HTTP_ENV,
    LINK_ENV,
    Sockets,
    Supervisor,
    worker_settings,
)
from stream_server.workers.worker_app import WorkerApp

log = logging.getLogger("stream_server.workers")


class WriterServer(StreamServer):
    """The writer's uvicorn server, which starts the link and the workers once it
    serves, and stops them before itself."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: StreamServerApp,
        supervisor: Supervisor,
        runtime: Path,
        watcher: FileWatcher | None,
    ) -> None:
        super().__init__(config, app, watcher)
        self.supervisor = supervisor
        self.host = writer_host(app)
        self.runtime = runtime
        if app.replication is not None:  # a standby's re-copy execs this process again
            app.replication.recopy.before_restart = self.stop_workers

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        await self.host.start(self.supervisor.sockets.link)
        await self.supervisor.start()
        address = self.supervisor.sock.getsockname()
        log.info(
            "serving on %s port %d with %d worker processes",
            address[0],
            address[1],
            self.supervisor.count,
        )

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.stop_workers()
        try:
            await super().shutdown(sockets)
        finally:
            shutil.rmtree(self.runtime, ignore_errors=True)

    async def stop_workers(self) -> None:
        """The workers stopped (their live reads ended, their calls in flight answered)
        and reaped, and the port closed: before this server stops, and before this
        process execs itself again (a standby's re-copy), whose new image starts its
        own workers on the port."""
        await self.supervisor.stop(grace=SHUTDOWN_GRACE + 1)
        self.supervisor.sock.close()  # the port is free for whatever runs next (a fenced start)
        await self.host.stop()


def writer_host(app: StreamServerApp) -> WriterHost:
    """The writer's side of the links, over the app's store, its refusals, its limiter
    and its live readers' slots: one set of each for the pod."""
    return WriterHost(
        app.store,
        app.store_refusal,
        app.store_clear,
        app.reads_clear,
        app.limiter,
        app.reader_slots,
    )


# What a relay may add to a request head: headers, and their names' and values' bytes.
RELAY_HEADERS = 8
RELAY_HEADER_BYTES = 1024


def writer_server(
    settings: Any, app: StreamServerApp, count: int, log_config: dict[str, Any] | None
) -> WriterServer:
    """The writer's server, over ``count`` workers on the port it binds now (a port in
    use stops the start here, at once, naming --port: ``listen.CannotListen``)."""
    sock = listen_socket(settings.host, settings.port)
    remove_stale_runtimes(Path(tempfile.gettempdir()))
    # Mode 0700: only this user. Named by the writer's pid, so a later start can tell it
    # from a live writer's once a kill -9 left it behind.
    runtime = Path(tempfile.mkdtemp(prefix=f"{RUNTIME_PREFIX}{os.getpid()}-"))
    # The port its workers will hold: a start after a kill -9 of this writer waits for
    # them on it, and for nothing else (``stream_server/listen.py``).
    (runtime / PORT_FILE).write_text(str(sock.getsockname()[1]))
    metrics = runtime / "metrics" if app.metrics is not None else None
    sockets = Sockets(link=runtime / "link.sock", http=runtime / "http.sock", metrics=metrics)
    if app.metrics is not None and metrics is not None:
        metrics.mkdir()
        app.metrics.gather_workers(str(metrics))  # one scrape, the whole pod
    app.headers_checked = True  # the workers checked them
    app.behind_workers = True
    # The public port's protocol: it hands a connection over to the replication stream
    # that a worker's tunnel asked for (``workers/tunnel.py``), which uvicorn's own
    # protocol leaves unanswered. Its head limits leave room for what a relay adds to a
    # head the worker admitted (the client's address, httpx's own headers), and its
    # connections are bounded by the open-file limit only: every worker's relayed
    # requests share it, each worker having admitted its own up to --max-connections.
    # A copy, not ``dataclasses.replace``: that checks the values again, and the room
    # added to a --max-header-bytes at its bound (1 MiB) would be refused.
    relayed = copy.copy(settings)
    relayed.max_headers = settings.max_headers + RELAY_HEADERS
    relayed.max_header_bytes = settings.max_header_bytes + RELAY_HEADER_BYTES
    relayed.max_connections = 0
    http, limit_concurrency = http_protocol(relayed)
    config = uvicorn_config(
        app,
        settings,
        log_config,
        listen=False,
        uds=str(sockets.http),
        http=http,
        limit_concurrency=limit_concurrency,
        timeout_keep_alive=settings.keep_alive_timeout,
    )
    supervisor = Supervisor(settings, count, sock, sockets)
    # The writer's own app checks tokens too (the subscriptions' paths are relayed to it).
    return WriterServer(config, app, supervisor, runtime, file_watcher(settings, app.auth, None))


def serve_worker() -> int:
    """A worker process (the ``worker`` command, started by the writer's ``Supervisor``)."""
    gc.set_threshold(*GC_THRESHOLDS)  # as the writer's (``serving.py``)
    settings = worker_settings()
    log_config = configure(settings.log_level, settings.log_format)
    proxy = WriterProxy.on_socket(Path(os.environ[HTTP_ENV]))
    app = WorkerApp(settings, Path(os.environ[LINK_ENV]), proxy)
    config, tls = public_config(app, settings, log_config)
    server = StreamServer(config, app, watcher=file_watcher(settings, app.auth, tls))
    gc.freeze()  # what the start built lives as long as the worker
    server.run(sockets=[socket.socket(fileno=int(os.environ[FD_ENV]))])
    return 0 if server.started else 1
