"""The HTTP ceiling: a minimal Starlette app that answers POST with 204.

    python e2e/bench/ceiling_app.py PORT [PROCESSES]

It runs under the uvicorn settings our server uses (stream_server/server.py:
uvloop, httptools, one worker, lifespan on, no access log, no Server header,
no concurrency limit), so what it reaches is the most a Python server on this
stack can do here: ours can only come close to it, never pass it.

With PROCESSES > 1 (the workers workload's ceiling, against ours with
``--workers N``) this process binds the port and forks PROCESSES uvicorn servers
that share its listening socket; it serves nothing itself, forwards SIGTERM and
SIGINT to them and exits when they have. That is how ours spreads connections
(its writer binds the port and its workers inherit the socket:
stream_server/workers/supervisor.py), and uvicorn's own ``workers=N``, done by
fork so that the app stays in this file: the share of the ceiling then measures
our code, not a different way to accept. N processes each on its own
SO_REUSEPORT socket (the kernel hashing connections among them) were the other
choice; on this machine they measured the same (2 processes, 64 connections,
three 4 s runs alternating: 22,000 to 33,000 req/s against 31,000 to 34,000
shared, 2026-11-26), within the noise.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import sys

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def ok(request: Request) -> Response:
    await request.body()
    return Response(status_code=204)


app = Starlette(routes=[Route("/{path:path}", ok, methods=["GET", "HEAD", "POST", "PUT"])])


def serve(port: int, sock: socket.socket | None = None) -> None:
    import uvicorn

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
        server_header=False,
        limit_concurrency=None,
    )
    uvicorn.Server(config).run(sockets=[sock] if sock else None)


def listen_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)  # uvicorn's default backlog
    return sock


def serve_from(port: int, processes: int) -> None:
    """``processes`` uvicorn servers on one listening socket; this process only waits."""
    import uvicorn  # noqa: F401  (imported once, before the fork, for every child)

    sock = listen_socket(port)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphan if this one dies
            serve(port, sock)
            os._exit(0)
        children.append(pid)
    sock.close()

    def forward(signum: int, _frame: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for _ in children:
        os.wait()


def main() -> None:
    port = int(sys.argv[1])
    processes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    if processes > 1:
        serve_from(port, processes)
    else:
        serve(port)


if __name__ == "__main__":
    main()
