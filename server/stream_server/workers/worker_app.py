"""A worker process's ASGI app: the stream protocol over a ``LinkedStore``, the rest relayed.

A worker runs the protocol layer itself (paths, headers, offsets, producer
headers, bodies, auth, rate limits, live readers' responses) and asks the writer
only for the store's work, so the CPU a request costs is spread over the workers
and the writer spends its one core on what must be serial. What the protocol
layer does not cover (health, metrics, replication, the archive, subscriptions'
``__ds`` paths) goes whole to the writer's HTTP socket (``WriterProxy``). On a
replica set's member or a replica cluster's server a request the writer would not
let through at once goes there too, and the writer answers it as a single process
does: a write it would refuse or hold (a standby's, a primary's waiting for its
standbys), before the body is read; a read while the replica is stale; and every
live read (``_here``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from stream_format.layout import Layout
from stream_server.config import Settings
from stream_server.node.modes import topology_of
from stream_server.node.streams import WRITE_METHODS, token_auth
from stream_server.protocol.context import raw_path
from stream_server.protocol.handlers import READS, Context, StreamRoutes
from stream_server.protocol.http import Receive, Scope, Send, query_params
from stream_server.protocol.subscriptions import is_control
from stream_server.request_metrics import RequestMetrics
from stream_server.streams.errors import StreamError
from stream_server.workers.linked_limits import LinkedLimiter, LinkedSlots
from stream_server.workers.linked_store import LinkedStore, WriterLost
from stream_server.workers.local_reads import LocalReads
from stream_server.workers.proxy import WriterProxy

log = logging.getLogger("stream_server.workers")


class WorkerApp:
    """What a worker serves on the pod's port."""

    def __init__(self, settings: Settings, link: Path, proxy: WriterProxy) -> None:
        self.settings = settings
        self.link_path = link
        self.local = LocalReads(Layout(settings.data_dir))
        self.store = LinkedStore(self._writer_lost, self.local, settings.max_json_messages)
        self.auth = token_auth(settings)
        # The pod's limits are the writer's: one limiter, one set of live readers' slots.
        limiter = LinkedLimiter(self.store) if settings.rate_limit > 0 else None
        # Multiprocess metrics (the writer set their directory in our environment).
        self.metrics = RequestMetrics(None) if settings.metrics else None
        context = Context(
            self.store,
            settings,
            self.metrics,
            auth=self.auth,
            limiter=limiter,
            slots=LinkedSlots(self.store),
        )
        self.store.read_chunk = context.read_chunk
        self.streams = StreamRoutes(context)
        self.proxy = proxy
        self.base = settings.base_path
        self.base_raw = settings.base_path.encode()
        # A replica set's member, a replica cluster's server: the writer's gates decide
        # what is served here (``_here``).
        self.gated = topology_of(settings).gated
        self.on_fatal: Callable[[], None] | None = None  # the server stops (serving.py)

    def _writer_lost(self) -> None:
        if self.store.stopping:
            return
        log.error("the writer process went away: this worker stops")
        if self.on_fatal is not None:
            self.on_fatal()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if (
            self.metrics is not None
            and scope["type"] == "http"
            and scope["path"].startswith(self.base)
        ):
            await self.metrics.measure(self._serve, scope, receive, send)  # as a single server
        else:
            await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.base):
            raw = raw_path(scope)
            if not is_control(raw[len(self.base_raw) :]) and await self._here(scope):
                try:
                    await self.streams(scope, receive, send)
                except WriterLost:
                    abort = scope.get("extensions", {}).get("stream_server.abort")
                    if abort is not None:
                        abort()
                return
        await self.proxy(scope, receive, send)

    async def _here(self, scope: Scope) -> bool:
        """Whether this worker serves a stream request itself: always, but on a replica
        set's member (``gated``), where only what the writer would let through at once
        is: a write it takes at once (its refusal, or its wait for standbys, is the
        writer's, as a single process gives it before the routes), and a catch-up read
        while the replica is current (a stale one's 503 is the writer's). A live read
        is relayed: its wait ends when the replica goes stale, an event only the
        writer sees."""
        if not self.gated:
            return True
        method = scope["method"]
        if method in WRITE_METHODS:
            ask = "writes_open"
        elif method in READS and "live" not in query_params(scope):
            ask = "reads_open"
        else:
            return False
        try:
            return bool(await self.store.call(ask))
        except (StreamError, WriterLost):  # the writer is not reachable: the relay answers
            return False

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.store.connect(self.link_path)
                except OSError as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.store.close()
                await self.proxy.close()
                self.local.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def end_live_reads(self) -> None:
        """As ``StreamServerApp.end_live_reads``: the worker begins to stop."""
        self.store.release_waiters()

    async def hand_over(self) -> None:
        """Nothing: the writer holds the Lease, and hands it over when it stops."""
