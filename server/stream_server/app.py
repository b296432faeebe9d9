"""The ASGI application: stream routes on the hot path, Starlette for the rest.

A node is a ``Topology`` (what this server is in its cluster: ``node/topology.py``)
and a list of Parts (its services: ``node/part.py``); this app assembles them and
serves. Requests under the stream base path go straight to the protocol handlers;
health, readiness and the Parts' routes are Starlette routes beside them. The
lifespan starts recovery as a task (``background_recovery``), so the socket opens
at once: probes and metrics answer during recovery, stream requests get 503 with
``Retry-After`` until it ends. The lifespan's end closes the store with a final
checkpoint; live reads are ended before that, as soon as the server begins to stop
(``end_live_reads``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import BaseRoute, Route

from stream_server.background_recovery import RETRY_AFTER, BackgroundRecovery
from stream_server.config import Settings
from stream_server.metrics import Metrics
from stream_server.node.archive_part import ArchivePart
from stream_server.node.backups import BackupsPart
from stream_server.node.metrics_part import MetricsPart
from stream_server.node.modes import topology_of
from stream_server.node.part import Part
from stream_server.node.service_part import ServicePart
from stream_server.node.store_factory import Listeners, StoreFactory
from stream_server.node.streams import WRITE_METHODS, token_auth
from stream_server.node.subscriptions_part import SubscriptionsPart
from stream_server.protocol.handlers import Context, StreamRoutes
from stream_server.protocol.http import Receive, Scope, Send, respond, text_headers
from stream_server.protocol.live import ReaderSlots
from stream_server.protocol.refusal import Refusal
from stream_server.ratelimit import RateLimiter

log = logging.getLogger("stream_server")

# A stream request while the start's recovery runs.
RECOVERING = Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], b"recovery not finished\n")
# A stream request once the store has stopped: the server is shutting down, or a
# standby installs a re-copy and execs itself again (replication/recopy.py).
STOPPED = Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], b"not serving: stopping\n")

# The services, in the order the node runs them: the store's listeners and the starts
# in this order, the stops in the reverse. Those that shape the store are built first.
SERVICES: tuple[type[ServicePart], ...] = (SubscriptionsPart, ArchivePart, BackupsPart, MetricsPart)

P = TypeVar("P", bound=Part)


class StreamServerApp:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.kind = topology_of(settings)
        self.metrics = Metrics() if settings.metrics else None
        self._built: dict[type[Part], Part] = {}
        self._build(shapes_store=True)
        listeners = Listeners()
        self.topology = self.kind(
            settings, StoreFactory(settings, listeners.events(), list(self._built.values()))
        )
        self.store = self.topology.store
        # The mode's own objects (None where this node is not in that mode).
        self.replication, self.follower = self.topology.replication, self.topology.follower
        for part in self._built.values():
            part.bind()
        self.recovery = BackgroundRecovery(
            self.store,
            on_failure=self._recovery_failed,
            serving=f"under {settings.base_path} from {settings.data_dir}",
            opened=self.topology.opened(),
        )
        # Told when recovery fails, so that the server stops (set by server.py).
        self.on_fatal: Callable[[], None] | None = None
        self.auth = token_auth(settings)
        # The pod's one limiter and set of live readers' slots (its workers ask these).
        self.limiter = (
            RateLimiter(settings.rate_limit, settings.rate_burst)
            if settings.rate_limit > 0
            else None
        )
        self.reader_slots = ReaderSlots.capped(
            settings.max_live_readers, settings.max_live_readers_per_client
        )
        self._build(shapes_store=False)
        subscriptions = self.part(SubscriptionsPart)
        assert subscriptions is not None
        self.subscriptions = subscriptions.subscriptions
        self.streams = StreamRoutes(
            Context(
                self.store,
                settings,
                self.metrics,
                auth=self.auth,
                limiter=self.limiter,
                # Reads only while this replica is current within its staleness bound.
                read_gate=self.topology.read_gate,
                slots=self.reader_slots,
            ),
            self.subscriptions,
        )
        self.parts = [self._built[c] for c in SERVICES if c in self._built]
        self.parts += self.topology.parts(lambda: self.recovery.finished)
        listeners.bind(self.parts)
        self.web = self._serve_parts()
        self.base = settings.base_path
        self.stopping = False
        # The lifespan's end closed the store with its storage sound: the process exits 0.
        self.stopped_cleanly = False
        # Serving only what worker processes relay (``workers/``): each request's client
        # is the one the worker names.
        self.behind_workers = False
        # True when the HTTP protocol already refused heads past --max-header-bytes
        # and --max-headers (http_limits does): then they are not counted twice.
        self.headers_checked = False

    def _serve_parts(self) -> Starlette:
        """The Parts' series, refusals, paths ahead of Starlette, and Starlette's routes."""
        if self.metrics is not None:
            for part in self.parts:
                for collector in part.collectors():
                    self.metrics.registry.register(collector)
        # A write asks the topology, then these (the archive behind its pending bound).
        self.refusers = [p for p in self.parts if p.refuses_writes]
        self.refuses_writes = self.topology.refuses_writes or bool(self.refusers)
        self.ahead = {path: asgi for part in self.parts for path, asgi in part.ahead().items()}
        routes: list[BaseRoute] = [
            Route("/healthz", self.healthz, methods=["GET", "HEAD"]),
            Route("/readyz", self.readyz, methods=["GET", "HEAD"]),
        ]
        routes += [route for part in self.parts for route in part.routes()]
        return Starlette(routes=routes, lifespan=self.lifespan)

    def _build(self, *, shapes_store: bool) -> None:
        """Build the services that shape the store (before it), or the others (after)."""
        for cls in SERVICES:
            if cls.shapes_store == shapes_store and (part := cls.build(self)) is not None:
                self._built[cls] = part

    def part(self, kind: type[P]) -> P | None:
        """The Part of that class, if this node has one."""
        part = self._built.get(kind)
        return part if isinstance(part, kind) else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.behind_workers and scope["type"] == "http":
            scope["client"] = _relayed_client(scope)
        if scope["type"] == "http" and not self.headers_checked and self._headers_too_large(scope):
            await respond(
                send,
                431,
                text_headers([(b"connection", b"close")]),
                b"request headers too large or too many\n",
            )
            return
        if scope["type"] == "http" and scope["path"].startswith(self.base):
            if (closed := self._not_serving()) is not None:
                await respond(send, closed.status, text_headers(closed.headers), closed.body)
            elif (
                self.refuses_writes
                and scope["method"] in WRITE_METHODS
                and (refusal := await self.write_refusal()) is not None
            ):
                await self.streams.refuse(
                    scope, send, refusal.status, refusal.headers, refusal.body
                )
            elif self.metrics is None or not self.metrics.counts_requests:
                await self.streams(scope, receive, send)
            else:
                await self.metrics.measure(self.streams, scope, receive, send)
        elif scope["type"] == "http" and (ahead := self.ahead.get(scope["path"])) is not None:
            await ahead(scope, receive, send)  # ahead of Starlette (``Part.ahead``)
        else:
            await self.web(scope, receive, send)

    async def write_refusal(self) -> Refusal | None:
        """The topology's refusal of a write (a standby's; a primary's may wait), else a
        Part's (the archive behind its pending bound). Asked before every write, here
        and by the writer for its workers (``workers/``)."""
        if (refusal := await self.topology.write_refusal()) is not None:
            return refusal
        for part in self.refusers:
            if (refusal := part.write_refusal()) is not None:
                return refusal
        return None

    def store_clear(self) -> bool:
        """Whether no call of a worker can be refused now (``store_refusal``'s fast path):
        recovered, and writes taken at once (a replica set's primary in steady state)."""
        if not self.recovery.finished or not self.topology.writes_open():
            return False
        return all(part.write_refusal() is None for part in self.refusers)

    def reads_clear(self) -> bool:
        """Whether a worker may serve a catch-up read itself now (``workers/``): recovered,
        and current within the staleness bound on a replica set's member. Else the worker
        relays it, and these routes answer it (their 503) as a single process does."""
        if not self.recovery.finished:
            return False
        gate = self.streams.context.read_gate
        return gate is None or gate.fresh_for() > 0

    async def store_refusal(self, write: bool) -> Refusal | None:
        """What the writer answers a worker's store call with instead (``workers/``):
        what this app would answer the request itself."""
        if (closed := self._not_serving()) is not None:
            return closed
        if write and self.refuses_writes:
            return await self.write_refusal()
        return None

    def _not_serving(self) -> Refusal | None:
        """Before recovery has finished, and once the store has stopped (a request that
        reached it then would find its threads gone), a stream request gets a 503."""
        if not self.recovery.finished:
            return RECOVERING
        if not self.store.ready:
            return STOPPED
        return None

    def _headers_too_large(self, scope: Scope) -> bool:
        headers = scope["headers"]
        if len(headers) > self.settings.max_headers:
            return True
        return sum(len(k) + len(v) for k, v in headers) > self.settings.max_header_bytes

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.topology.before_open()
        self.recovery.start()
        tasks = [
            asyncio.create_task(self._start(part), name=f"{type(part).__name__} start")
            for part in self.parts
        ]
        work = [w for part in self.parts if (w := part.primary_work()) is not None]
        self.topology.start(self.recovery.recovered, work)
        try:
            yield
        finally:
            await self.topology.stop()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for part in reversed(self.parts):
                await part.stop()  # no delivery, no upload in flight once the store closes
            await self.recovery.stop()
            self._stopped()

    async def _start(self, part: Part) -> None:
        """A Part starts once recovery has finished; never if it failed (the server stops)."""
        if await self.recovery.recovered():
            await part.start()

    def _stopped(self) -> None:
        """The store is closed: cleanly unless its storage failed closed (the final
        checkpoint is then not taken), which ``serve`` turns into the exit status."""
        if self.store.failed:
            log.error("stopped with storage failed closed: %s", self.store.failed)
        else:
            self.stopped_cleanly = True
            log.info("stopped cleanly")

    def _recovery_failed(self, error: BaseException) -> None:
        if self.on_fatal is not None:
            self.on_fatal()

    async def hand_over(self) -> None:
        """Called before uvicorn stops listening, while a replica set's standbys' streams
        are still open: a primary hands the Lease over (``Topology.hand_over``)."""
        await self.topology.hand_over()

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

    async def healthz(self, request: Request) -> PlainTextResponse:
        """Alive, also while recovery runs; 503 once storage failed closed.

        A failed-closed server refuses every write until it restarts, and only a
        restart (recovery replays the WAL) can bring it back: answering 503 here
        lets the kubelet's liveness probe do that restart.
        """
        headers = {"cache-control": "no-store"}
        if self.store.failed:
            return PlainTextResponse(
                f"storage failed closed: {self.store.failed}; a restart recovers\n",
                status_code=503,
                headers=headers,
            )
        if self.recovery.error is not None:
            return PlainTextResponse(
                f"recovery failed: {self.recovery.error}\n", status_code=503, headers=headers
            )
        return PlainTextResponse("ok\n", headers=headers)

    async def readyz(self, request: Request) -> JSONResponse:
        """Ready: recovery finished, storage has not failed closed, data dir writable."""
        problems = []
        if self.stopping:
            problems.append("shutting down")
        elif self.recovery.error is not None:
            problems.append(f"recovery failed: {self.recovery.error}")
        elif not self.recovery.finished:
            problems.append("recovery not finished")
        elif not self.store.ready:
            problems.append("not serving")
        elif late := [p for part in self.parts if (p := part.not_started()) is not None]:
            problems.append(late[0])
        if self.store.failed:
            problems.append(f"storage failed closed: {self.store.failed}")
        problems += [p for part in self.parts if (p := part.unready()) is not None]
        if not await asyncio.to_thread(_writable, self.settings.data_dir):
            problems.append("data directory is not writable")
        body: dict[str, object] = {
            "ready": not problems,
            "problems": problems,
            "streams": len(self.store.streams),
        }
        if not self.recovery.finished:
            body["recovery"] = self.recovery.status()
        return JSONResponse(
            body, status_code=503 if problems else 200, headers={"cache-control": "no-store"}
        )


def _writable(path: Path) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=path, prefix=".probe-")
        os.close(fd)
        os.unlink(name)
        return True
    except OSError:
        return False


def _relayed_client(scope: Scope) -> tuple[str, int] | None:
    """The client a worker named in a relayed request (``workers/proxy.py``)."""
    for key, value in scope["headers"]:
        if key == b"x-ds-worker-client":
            return value.decode("latin-1"), 0
    return None


def create_app(settings: Settings | None = None) -> StreamServerApp:
    return StreamServerApp(settings or Settings())
