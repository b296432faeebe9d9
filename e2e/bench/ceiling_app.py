"""The HTTP ceiling: a minimal Starlette app that answers POST with 204.

    python e2e/bench/ceiling_app.py PORT

It runs under the uvicorn settings our server uses (stream_server/server.py:
uvloop, httptools, one worker, lifespan on, no access log, no Server header,
no concurrency limit), so what it reaches is the most a Python server on this
stack can do here: ours can only come close to it, never pass it.
"""

from __future__ import annotations

import importlib.util
import sys

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def ok(request: Request) -> Response:
    await request.body()
    return Response(status_code=204)


app = Starlette(routes=[Route("/{path:path}", ok, methods=["GET", "HEAD", "POST", "PUT"])])


def main() -> None:
    import uvicorn

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
        server_header=False,
        limit_concurrency=None,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
