"""The server in-process: its ASGI app on a real data directory, driven by httpx without a socket.

What Starlette's ``TestClient`` and httpx's ``ASGITransport`` do, for this
server: the real app (``stream_server.app.create_app``) on the real engine
(LMDB, WAL, segment files) in the test's temporary directory, started and
stopped through the ASGI lifespan as uvicorn would, with the same flags a
server process takes (``testkit.servers.stream_server_command``'s). A
request costs well under a millisecond instead of a socket round trip, a
test needs no process and no port, and it can reach the app's state
(``server.app.store``) directly.

Two ways to drive it, one app underneath:

- ``in_process(data_dir, *flags)``, an async context manager, for async
  tests: ``server.client`` is an ``httpx.AsyncClient`` on the test's loop.
- ``in_thread(data_dir, *flags)``, a context manager, for sync tests: the
  app runs on a loop in a thread of its own (as ``TestClient`` runs it on
  anyio's portal) and ``server.http`` is a plain ``httpx.Client``.

Unlike httpx's ``ASGITransport``, which hands back a response only once the
app has finished it, ``StreamingASGITransport`` streams: a test reads an
SSE response's events as the app sends them, and closing the response
tells the app the client went away (``http.disconnect``), as a closed
socket would. ``RAW_TARGET`` sends a request target unnormalised, as a raw
socket would. What this cannot show is what uvicorn does: real sockets,
header and body timeouts, connection limits, TLS, signals, a kill -9;
those tests keep a process (the ``processes`` marker, ``testkit.tiers``).

The fixtures ``app_server`` (sync) and ``async_app_server`` (async) make
one server per call on ``tmp_path`` and stop them all when the test ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

import httpx
import pytest

if TYPE_CHECKING:  # imported when used: the root conftest loads this plugin for every test,
    # and a checkout installed without the server's extra still runs the others
    from stream_server.app import StreamServerApp
    from stream_server.workers.worker_app import WorkerApp

T = TypeVar("T")

URL = "http://testserver"
# A request extension: the request target sent as it is, where httpx would normalise
# the URL (``a/../b`` becomes ``b``): ``client.put(url, extensions={RAW_TARGET: b"/v1/.."})``.
RAW_TARGET = "raw_target"
READY_TIMEOUT = 30.0  # seconds for recovery and the subscriptions' start, as Child's default

Message = dict[str, Any]

__all__ = [
    "RAW_TARGET",
    "InProcessServer",
    "StreamingASGITransport",
    "app_server",
    "async_app_server",
    "build_app",
    "in_process",
    "in_thread",
    "linked_worker",
]


def build_app(data_dir: Path, *flags: str, env: dict[str, str] | None = None) -> StreamServerApp:
    """The app ``durable-streams-server serve --data-dir data_dir *flags`` would serve.

    ``env`` stands for the server's environment (``DS_*`` settings); the test
    process's own environment is not read, as a test's server should not
    depend on who runs it. (The fault hook's ``DS_FAULT`` is not a setting: the
    app reads it from ``os.environ``, which a test sets with ``monkeypatch``.)
    """
    from stream_format.layout import Layout
    from stream_server.app import create_app
    from stream_server.config import add_arguments, settings_from
    from stream_server.engine.data_dir import prepare

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = settings_from(
        parser.parse_args(["--data-dir", str(data_dir), *flags]), environ=dict(env or {})
    )
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    prepare(Layout(settings.data_dir))  # as serve() does before it builds the app
    return create_app(settings)


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """httpx's ASGI transport, streaming: the response comes back at its
    ``http.response.start`` and its body as the app sends it.

    Each request runs the app as a task on the running loop; a response closed
    before its end sends the app ``http.disconnect`` and waits for it to stop.
    ``aclose`` cancels what is left. An exception the app raises before it
    starts its response is raised to the caller, as a bug should be.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], client: str = "127.0.0.1") -> None:
        self.app = app
        self.client_host = client
        self.tasks: set[asyncio.Task[None]] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        target = request.extensions.get(RAW_TARGET) or request.url.raw_path
        raw_path, _, query = target.partition(b"?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": request.url.scheme,
            "path": unquote(raw_path.decode("ascii")),  # as uvicorn decodes it
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": (self.client_host, 50000),
            "server": (request.url.host, request.url.port or 80),
            "state": {},
        }
        sent: asyncio.Queue[Message | BaseException | None] = asyncio.Queue()
        gone = asyncio.Event()
        body_given = False

        async def receive() -> Message:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if not gone.is_set():
                sent.put_nowait(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except BaseException as exc:
                sent.put_nowait(exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                sent.put_nowait(None)

        task = asyncio.create_task(run(), name=f"asgi {request.method} {request.url.path}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        start = await sent.get()
        if isinstance(start, BaseException):
            raise start
        if start is None or start["type"] != "http.response.start":
            raise RuntimeError(f"the app answered {request.url} without a response ({start!r})")
        return httpx.Response(
            start["status"],
            headers=start.get("headers", []),
            stream=_Body(sent, gone, task),
            request=request,
        )

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class _Body(httpx.AsyncByteStream):
    """A response body as the app sends it; closing it early is the client going away."""

    def __init__(
        self,
        sent: asyncio.Queue[Message | BaseException | None],
        gone: asyncio.Event,
        task: asyncio.Task[None],
    ) -> None:
        self.sent = sent
        self.gone = gone
        self.task = task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (message := await self.sent.get()) is not None:
            if isinstance(message, BaseException):
                raise httpx.ReadError(f"the app failed mid-response: {message!r}") from message
            if message["type"] != "http.response.body":
                continue
            if chunk := message.get("body", b""):
                yield chunk
            if not message.get("more_body", False):
                return
        raise httpx.RemoteProtocolError("the app ended without finishing its response")

    async def aclose(self) -> None:
        self.gone.set()
        if not self.task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self.task), READY_TIMEOUT)


class _Lifespan:
    """The ASGI lifespan protocol from the server's side, as uvicorn drives it."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.to_app: asyncio.Queue[Message] = asyncio.Queue()
        self.from_app: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def _step(self, event: str) -> None:
        await self.to_app.put({"type": f"lifespan.{event}"})
        assert self.task is not None
        got = asyncio.ensure_future(self.from_app.get())
        await asyncio.wait({got, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if not got.done():
            got.cancel()
            self.task.result()  # the lifespan's exception, if it raised one
            raise RuntimeError(f"the app's lifespan ended during {event}")
        answer = got.result()
        if answer["type"] != f"lifespan.{event}.complete":
            raise RuntimeError(f"lifespan {event} failed: {answer.get('message', answer)}")

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.task = asyncio.create_task(
            self.app(scope, self.to_app.get, self.from_app.put), name="lifespan"
        )
        await self._step("startup")

    async def stop(self) -> None:
        await self._step("shutdown")
        assert self.task is not None
        await self.task


class InProcessServer:
    """One in-process server: its app, the data directory, and a client for it.

    ``url`` and ``base`` mirror ``conftest.ServerProcess``'s, so a test keeps
    its paths; ``client`` (async) or ``http`` (sync) is the one to send with.
    """

    url = URL

    def __init__(self, app: StreamServerApp) -> None:
        self.app = app
        self.data_dir = Path(app.settings.data_dir)
        self.base = f"{URL}{app.settings.base_path}"
        self.client: httpx.AsyncClient | None = None
        self.http: httpx.Client | None = None
        # For more sync clients on the same app (other headers, a token of their own):
        # ``httpx.Client(transport=server.transport, base_url=server.url)``.
        self.transport: httpx.BaseTransport | None = None
        self.worker: WorkerApp | None = None  # the worker's app the client talks to, if any


async def _until_ready(app: StreamServerApp) -> None:
    """Wait for recovery and the subscriptions' start: what /readyz waits for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT
    while not (app.recovery.finished and app.subscriptions.started):
        if app.recovery.error is not None:
            raise RuntimeError(f"recovery failed: {app.recovery.error}")
        if loop.time() > deadline:
            raise TimeoutError(f"the app did not become ready in {READY_TIMEOUT} s")
        await asyncio.sleep(0.01)  # the app's own start polls as well (app.py)


@contextlib.asynccontextmanager
async def in_process(
    data_dir: Path, *flags: str, env: dict[str, str] | None = None, worker: bool = False
) -> AsyncIterator[InProcessServer]:
    """The app started on ``data_dir`` with ``flags``, ready, with ``client`` on this loop;
    on exit, live reads are ended and the app stopped (its store closed with a checkpoint).

    ``worker``: the client talks to a worker's app (``--workers N``) whose link to this
    app's store is a real Unix socket, as a worker process's is; what the worker
    relays goes to the app in-process."""
    server = InProcessServer(build_app(data_dir, *flags, env=env))
    lifespan = _Lifespan(server.app)
    await lifespan.start()
    try:
        await _until_ready(server.app)
        async with contextlib.AsyncExitStack() as stack:
            front: Any = server.app
            if worker:
                front = server.worker = await stack.enter_async_context(linked_worker(server.app))
            transport = StreamingASGITransport(front)
            client = httpx.AsyncClient(transport=transport, base_url=URL, timeout=30)
            server.client = await stack.enter_async_context(client)
            yield server
            front.end_live_reads()  # as the server does when it begins to stop
    finally:
        await lifespan.stop()


@contextlib.asynccontextmanager
async def linked_worker(app: StreamServerApp) -> AsyncIterator[WorkerApp]:
    """A worker's app over ``app``: its link served by a ``WriterHost`` on a socket in a
    directory of its own, its relayed requests handed to ``app``. A test enters it again
    for a second worker in front of the same writer."""
    from stream_server.workers.processes import writer_host
    from stream_server.workers.proxy import WriterProxy
    from stream_server.workers.worker_app import WorkerApp

    with tempfile.TemporaryDirectory(prefix="ds-link-") as where:
        link = Path(where) / "link.sock"
        host = writer_host(app)
        await host.start(link)
        worker = WorkerApp(app.settings, link, WriterProxy(StreamingASGITransport(app)))
        assert app.store.engine.meta is not None
        worker.local.log.share(app.store.engine.meta)  # one LMDB environment per process
        lifespan = _Lifespan(worker)
        await lifespan.start()
        try:
            yield worker
        finally:
            await lifespan.stop()
            await host.stop()


class _LoopThread:
    """An event loop in a daemon thread, for a sync test's in-process server."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="asgi app", daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(_awaited(coro), self.loop)
        return future.result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _awaited(value: Awaitable[T]) -> T:
    return await value


class _ThreadTransport(httpx.BaseTransport):
    """A sync transport that hands each request to the async one on the app's loop."""

    def __init__(self, loop: _LoopThread, inner: StreamingASGITransport) -> None:
        self.loop = loop
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        forwarded = httpx.Request(
            request.method,
            request.url,
            headers=request.headers,
            content=body,
            extensions=request.extensions,
        )
        response = self.loop.run(self.inner.handle_async_request(forwarded))
        return httpx.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=_SyncBody(self.loop, response),
            request=request,
        )


class _SyncBody(httpx.SyncByteStream):
    def __init__(self, loop: _LoopThread, response: httpx.Response) -> None:
        self.loop = loop
        self.chunks = response.aiter_raw()
        self.response = response

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                yield self.loop.run(self.chunks.__anext__())
            except StopAsyncIteration:
                return

    def close(self) -> None:
        self.loop.run(self.response.aclose())


@contextlib.contextmanager
def in_thread(
    data_dir: Path, *flags: str, env: dict[str, str] | None = None, worker: bool = False
) -> Iterator[InProcessServer]:
    """``in_process`` on a loop in a thread of its own, with ``http``, a sync client."""
    loop = _LoopThread()
    try:
        running = in_process(data_dir, *flags, env=env, worker=worker)
        server = loop.run(running.__aenter__())
        assert server.client is not None
        transport = _ThreadTransport(loop, server.client._transport)  # type: ignore[arg-type]
        server.transport = transport
        try:
            with httpx.Client(transport=transport, base_url=URL, timeout=30) as http:
                server.http = http
                yield server
        finally:
            loop.run(running.__aexit__(None, None, None))
    finally:
        loop.close()


@pytest.fixture
def app_server(tmp_path: Path) -> Iterator[Callable[..., InProcessServer]]:
    """Start in-process servers (``in_thread``) for a sync test: ``app_server(*flags)``,
    ``data_dir=`` to choose the directory (default ``tmp_path/app<n>``), ``env=``."""
    started = 0
    with contextlib.ExitStack() as stack:

        def make(
            *flags: str,
            data_dir: Path | None = None,
            env: dict[str, str] | None = None,
            worker: bool = False,
        ) -> InProcessServer:
            nonlocal started
            started += 1
            where = data_dir or tmp_path / f"app{started - 1}"
            return stack.enter_context(in_thread(where, *flags, env=env, worker=worker))

        yield make


@pytest.fixture
async def async_app_server(
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Awaitable[InProcessServer]]]:
    """Start in-process servers (``in_process``) for an async test:
    ``await async_app_server(*flags)``, with ``data_dir=`` and ``env=`` as ``app_server``'s."""
    started = 0
    async with contextlib.AsyncExitStack() as stack:

        async def make(
            *flags: str,
            data_dir: Path | None = None,
            env: dict[str, str] | None = None,
            worker: bool = False,
        ) -> InProcessServer:
            nonlocal started
            started += 1
            where = data_dir or tmp_path / f"app{started - 1}"
            return await stack.enter_async_context(
                in_process(where, *flags, env=env, worker=worker)
            )

        yield make
