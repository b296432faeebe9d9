"""Run the app under uvicorn (uvloop and httptools where installed)."""

from __future__ import annotations

import importlib.util
import logging

import uvicorn

from stream_server.app import create_app
from stream_server.auth import AuthConfigError
from stream_server.config import Settings
from stream_server.logs import configure

log = logging.getLogger("stream_server")


def serve(settings: Settings) -> int:
    log_config = configure(settings.log_level, settings.log_format)
    from stream_format.layout import Layout
    from stream_server.engine import LayoutError
    from stream_server.engine.layout import prepare

    try:
        prepare(Layout(settings.data_dir))
        app = create_app(settings)
    except (LayoutError, AuthConfigError) as exc:
        log.error("%s", exc)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan="on",
        access_log=False,
        log_config=log_config,
        timeout_graceful_shutdown=5,
        server_header=False,
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
        limit_concurrency=None,
        h11_max_incomplete_event_size=64 * 1024,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
