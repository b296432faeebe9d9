"""The HTTP ceiling: a minimal Starlette app that answers POST with 204.

    python e2e/bench/ceiling_app.py PORT [PROCESSES]

It runs under the uvicorn settings our server uses (stream_server/server.py:
uvloop, httptools, one worker, lifespan on, no access log, no Server header,
no concurrency limit), so what it reaches is the most a Python server on this
stack can do here: ours can only come close to it, never pass it.

With PROCESSES > 1 (the workers workload's ceiling, against ours with
``--workers N``) this process binds PROCESSES listening sockets on the port with
SO_REUSEPORT and forks one uvicorn server per socket; it serves nothing itself,
forwards SIGTERM and SIGINT to them and exits when they have. SO_REUSEPORT
rather than uvicorn's own ``workers=N`` (one listening socket shared by every
process): on a shared socket the process that wakes first takes the
connection, so wrk's 64 keep-alive connections, opened at once and kept for
the whole run, can split unevenly and stay so; SO_REUSEPORT hashes each
connection to one socket, an even split in expectation, and the kernel wakes
only that socket's process. The sockets are bound before the fork, so a
connection made while a child is still starting waits in its socket's
backlog instead of going to the one already serving.
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


def reuse_port_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)  # uvicorn's default backlog
    return sock


def serve_from(port: int, processes: int) -> None:
    """``processes`` uvicorn servers on SO_REUSEPORT sockets; this process only waits."""
    import uvicorn  # noqa: F401  (imported once, before the fork, for every child)

    sockets = [reuse_port_socket(port) for _ in range(processes)]
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    children = []
    for sock in sockets:
        pid = os.fork()
        if pid == 0:
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphan if this one dies
            for other in sockets:
                if other is not sock:
                    other.close()
            serve(port, sock)
            os._exit(0)
        children.append(pid)
    for sock in sockets:
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
