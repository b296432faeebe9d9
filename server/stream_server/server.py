"""Serve: which process runs what. One process serves everything (``--workers 1``),
or the writer runs the store and its workers serve HTTP (``workers/processes.py``); a
fenced server opens no storage at all. Uvicorn's servers are set up in ``serving.py``.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from stream_server.app import StreamServerApp, create_app
from stream_server.auth import AuthConfigError
from stream_server.config import Settings
from stream_server.engine import LayoutError
from stream_server.fencing import FencedApp, FenceWatch, fenced_at_start, restart_process
from stream_server.logs import configure
from stream_server.serving import (
    GC_THRESHOLDS,
    FencedServer,
    StreamServer,
    file_watcher,
    public_config,
    uvicorn_config,
)
from stream_server.workers.processes import writer_server
from stream_server.workers.supervisor import cpu_count

log = logging.getLogger("stream_server")


def serve(settings: Settings) -> int:
    log_config = configure(settings.log_level, settings.log_format)
    gc.set_threshold(*GC_THRESHOLDS)
    if fenced_at_start(settings.fence_file):
        return serve_fenced(settings, log_config)
    from stream_format.layout import Layout
    from stream_server.engine import dir_lock
    from stream_server.engine.data_dir import prepare

    try:
        # Held for the process's life, before anything is read: one writer per data
        # directory (engine/dir_lock.py). The kernel drops it when the process ends.
        dir_lock.acquire(settings.data_dir)
        prepare(Layout(settings.data_dir))
        app = create_app(settings)
        app.recovery.freeze_gc = True
    except (LayoutError, AuthConfigError, dir_lock.DataDirInUse) as exc:
        log.error("%s", exc)
        return 2
    count = settings.workers or cpu_count()
    if count > 1:
        try:
            server: StreamServer = writer_server(settings, app, count, log_config)
        except OSError as exc:
            log.error("%s", exc)
            return 1
    else:
        server = single_server(settings, app, log_config)
    if settings.fence_file:
        server.fence = FenceWatch(settings.fence_file, False, server.fence_now)
    return _ended(server, app)


def single_server(
    settings: Settings, app: StreamServerApp, log_config: dict[str, Any] | None
) -> StreamServer:
    """One process serving everything on the port (``--workers 1``)."""
    config, tls = public_config(app, settings, log_config)
    app.headers_checked = not isinstance(config.http, str)  # http_limits checks them exactly
    return StreamServer(config, app, watcher=file_watcher(settings, app.auth, tls))


def _ended(server: StreamServer, app: StreamServerApp) -> int:
    """Run ``server``; its exit status: 0 stopped cleanly, 1 storage failed, 2 layout."""
    server.run()
    if server.fence is not None and server.fence.requested:
        restart_process()  # fenced: the store is closed, the process starts again fenced
    failure = app.recovery.error
    if failure is not None:
        return 2 if isinstance(failure, LayoutError) else 1
    return 0 if server.started and app.stopped_cleanly else 1


def serve_fenced(settings: Settings, log_config: dict[str, Any] | None) -> int:
    """Serve fenced (``fencing.FencedApp``): the data directory is not opened at all.
    When the fence is lifted, the process starts again as an ordinary server."""
    log.warning(
        "fenced by %s: not opening %s; /healthz answers, /readyz and the rest 503",
        settings.fence_file,
        settings.data_dir,
    )
    config = uvicorn_config(FencedApp(settings.fence_file), settings, log_config)
    server = FencedServer(config)
    server.fence = FenceWatch(settings.fence_file, True, server.lift)
    server.run()
    if server.fence.requested:
        restart_process()
    return 0 if server.started else 1
