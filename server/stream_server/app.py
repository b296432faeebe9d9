"""The ASGI application: stream routes on the hot path, Starlette for the rest.

Requests under the stream base path go straight to the protocol handlers;
health, readiness (and metrics) are small Starlette routes beside them. The
lifespan starts recovery as a task (``background_recovery``), so the socket opens at
once: probes and metrics answer during recovery, stream requests get 503 with
``Retry-After`` until it ends. The lifespan's end closes the store with a
final checkpoint; live reads are ended before that, as soon as the server
begins to stop (``end_live_reads``).

It is over 400 lines because it is the one place that wires the parts (store,
recovery, replication, archive, subscriptions, metrics, workers' refusals) to the
routes and the lifespan; each part's logic lives in its own package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from stream_server.archive.backups_endpoint import BackupsEndpoint
from stream_server.archive.follow_position import promote
from stream_server.archive.follower import ArchiveFollower
from stream_server.archive.progress import OFF_DOCUMENT
from stream_server.archive.service import ArchiveService
from stream_server.auth import TokenAuth
from stream_server.background_recovery import RETRY_AFTER, BackgroundRecovery
from stream_server.config import Settings
from stream_server.engine import Engine, StorageError
from stream_server.engine.replica import AckGate, ReplicaHooks
from stream_server.faults import hook_from_env
from stream_server.metrics import Metrics
from stream_server.protocol.handlers import Context, ProtocolSettings, StreamRoutes
from stream_server.protocol.http import Receive, Scope, Send, respond, text_headers
from stream_server.protocol.live import ReaderSlots
from stream_server.ratelimit import RateLimiter
from stream_server.replication import fetch_endpoint, peer_token
from stream_server.replication.collector import ReplicationCollector
from stream_server.replication.identity import leave
from stream_server.replication.service import PrimaryWork, Replication
from stream_server.replication.write_fence import Refusal
from stream_server.streams.model import Stream
from stream_server.streams.retention import parse_policies
from stream_server.streams.store import StoreEvents, StoreLimits, StreamStore
from stream_server.subscriptions.service import Subscriptions, SubscriptionSettings

log = logging.getLogger("stream_server")

WRITE_METHODS = frozenset({"PUT", "POST", "DELETE", "PATCH"})
# A stream request while the start's recovery runs.
RECOVERING = Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], b"recovery not finished\n")
# A stream request once the store has stopped: the server is shutting down, or a
# standby installs a re-copy and execs itself again (replication/recopy.py).
STOPPED = Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], b"not serving: stopping\n")


class StreamServerApp:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics() if settings.metrics else None
        # The object-store archive (archive/service.py); None without --archive-url.
        self.archive = (
            ArchiveService(settings, lambda: self.store.engine.published_lsn)
            if settings.archive_url and not settings.archive_follow
            else None
        )
        # A replica set (docs/replication.md) builds the store on its own hooks and
        # gate (``Replication``); None in single-node mode, which then takes no step
        # of its own on any request.
        self.replication = (
            Replication(settings, self._build_store) if settings.replication_lease else None
        )
        # A replica cluster's server (--archive-follow) follows another cluster's archive
        # on a standby's engine hooks (docs/replica-clusters.md); None otherwise.
        follows = ReplicaHooks() if settings.archive_follow else None
        self.store = self.replication.store if self.replication else self._build_store(follows)
        if self.archive is not None:
            self.archive.bind_terms(
                self.store.engine, self.replication.hooks if self.replication else None
            )
        self.follower = (
            ArchiveFollower.from_settings(settings, self.store, follows)
            if follows is not None
            else None
        )
        # This server's own refusal of a write, beside a replica set's (a primary's may
        # wait): the archive behind its pending bound, or a replica cluster's read-only
        # server. None: nothing to ask on a write.
        self.local_write_refusal: Callable[[], Refusal | None] | None = (
            self.archive.refusal
            if self.archive is not None
            else self.follower.refusal
            if self.follower is not None
            else None
        )
        self.refuses_writes = self.replication is not None or self.local_write_refusal is not None
        self.recovery = BackgroundRecovery(
            self.store,
            on_failure=self._recovery_failed,
            serving=f"under {settings.base_path} from {settings.data_dir}",
            opened=self._opened(),
        )
        # Told when recovery fails, so that the server stops (set by server.py).
        self.on_fatal: Callable[[], None] | None = None
        self.auth = auth = (
            TokenAuth.from_file(Path(settings.auth_tokens_file))
            if settings.auth_tokens_file
            else None
        )
        # The pod's one limiter and set of live readers' slots (its workers ask these).
        self.limiter = limiter = (
            RateLimiter(settings.rate_limit, settings.rate_burst)
            if settings.rate_limit > 0
            else None
        )
        self.reader_slots = ReaderSlots.capped(
            settings.max_live_readers, settings.max_live_readers_per_client
        )
        self.subscriptions = Subscriptions(
            self.store,
            subscription_settings(settings),
            self.metrics,
            primary_only=bool(settings.replication_lease or settings.archive_follow),
        )
        self.streams = StreamRoutes(
            Context(
                self.store,
                protocol_settings(settings),
                self.metrics,
                auth=auth,
                limiter=limiter,
                # Reads only while this replica is current within its staleness bound.
                read_gate=self.replication.read_fence if self.replication is not None else None,
                slots=self.reader_slots,
            ),
            self.subscriptions,
        )
        self.base = settings.base_path
        self.base_bare = settings.base_path.rstrip("/")
        routes = [
            Route("/healthz", self.healthz, methods=["GET", "HEAD"]),
            Route("/readyz", self.readyz, methods=["GET", "HEAD"]),
            Route("/_archive/status", self.archive_status, methods=["GET"]),
        ]
        if self.archive is not None and self.metrics is not None:
            self.metrics.registry.register(self.archive.collector)
        if self.follower is not None and self.metrics is not None:
            self.metrics.registry.register(self.follower.collector)
        if self.replication is not None:
            if self.metrics is not None:
                self.metrics.registry.register(ReplicationCollector(self.replication))
            routes.append(Route("/replication", self.replication_status, methods=["GET"]))
            routes.append(
                Route("/replication/snapshot", self.replication_snapshot, methods=["GET"])
            )
            routes.append(
                Route("/replication/switchover", self.replication_switchover, methods=["POST"])
            )
        routes += BackupsEndpoint(  # base backups (docs/backup.md)
            settings,
            self.store.engine,
            ready=lambda: self.recovery.finished,
            allowed=self.replication.peer_allowed if self.replication is not None else None,
            taken=self.archive.archiver.backup_taken if self.archive is not None else None,
        ).routes()
        if self.metrics is not None:
            routes.append(Route("/metrics", self.metrics_endpoint, methods=["GET"]))
            self.metrics.bind(
                streams=lambda: len(self.store.streams),
                live=lambda mode: self.streams.live_readers[mode],
                data_dir=str(settings.data_dir),
                segment_bytes=lambda: sum(  # records held: retention's holes excluded
                    t.file_len - t.start_pos for t in list(self.store.engine.tails.values())
                ),
                ready=lambda: self.store.ready and not self.store.failed,
                failed=lambda: bool(self.store.failed),
                recovering=lambda: self.recovery.running,
                recovery=self.recovery.progress,
                recovery_seconds=self.recovery.seconds,
                startup_seconds=self.recovery.startup_seconds,
                recovery_interrupted=lambda: self.recovery.interrupted,
            )
            self.metrics.bind_retention(
                reclaimed=lambda: self.store.engine.reclaimed_bytes,
                policies=self.store.retention.stats,
            )
            manager = self.subscriptions.manager
            self.metrics.bind_subscriptions(
                pending_streams=manager.pending_stream_count, failing=manager.failing_count
            )
        self.web = Starlette(routes=routes, lifespan=self.lifespan)
        self.stopping = False
        # The lifespan's end closed the store with its storage sound: the process exits 0.
        self.stopped_cleanly = False
        self._subscriptions_error = ""
        # Serving only what worker processes relay (``workers/``): each request's client
        # is the one the worker names.
        self.behind_workers = False
        # True when the HTTP protocol already refused heads past --max-header-bytes
        # and --max-headers (http_limits does): then they are not counted twice.
        self.headers_checked = False

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
        elif (
            self.replication is not None
            and scope["type"] == "http"
            and scope["path"] in fetch_endpoint.PATHS
        ):
            # Ahead of Starlette: every replicated write waits for these (fetch_endpoint.py).
            await fetch_endpoint.serve(
                self.replication, scope, send, recovered=self.recovery.finished
            )
        else:
            await self.web(scope, receive, send)

    async def write_refusal(self) -> Refusal | None:
        """A replica set's refusal of a write (a standby's; a primary's may wait), else this
        server's own (the archive behind its pending bound, a replica cluster's server).
        Asked before every write, here and by the writer for its workers (``workers/``)."""
        if self.replication is not None and (refusal := await self.replication.writes.refusal()):
            return refusal
        if self.local_write_refusal is not None:
            return self.local_write_refusal()
        return None

    def store_clear(self) -> bool:
        """Whether no call of a worker can be refused now (``store_refusal``'s fast path):
        recovered, and writes taken at once (a replica set's primary in steady state)."""
        if not self.recovery.finished:
            return False
        if self.replication is not None and not self.replication.writes.open:
            return False
        return self.local_write_refusal is None or self.local_write_refusal() is None

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

    def _opened(self) -> Callable[[], None] | None:
        """What runs once the engine is open, before anything is written: a single node
        on a set member's directory leaves the set, and on a directory that followed an
        archive it is promoted (``archive/follow_position.py``); a follower finds where
        it resumes."""
        if self.settings.replication_lease:
            return None
        if self.follower is not None:
            return self.follower.opened
        engine, url = self.store.engine, self.settings.archive_url

        def single_node() -> None:
            promote(engine, url)  # first: it may refuse the start, before anything is written
            leave(engine)

        return single_node

    def _headers_too_large(self, scope: Scope) -> bool:
        headers = scope["headers"]
        if len(headers) > self.settings.max_headers:
            return True
        return sum(len(k) + len(v) for k, v in headers) > self.settings.max_header_bytes

    def _build_store(
        self, replica: ReplicaHooks | None = None, gate: AckGate | None = None
    ) -> StreamStore:
        """The store on its engine; in a replica set on the set's ``replica`` hooks and
        with its ack ``gate`` (``replication.service.StoreFactory``)."""
        s = self.settings
        return StreamStore(
            s.data_dir,
            limits=StoreLimits(
                default_ttl=s.default_ttl or None,
                max_streams=s.max_streams or None,
                hot_streams=s.hot_streams,
                max_producers_per_stream=s.max_producers_per_stream,
                max_fork_depth=s.max_fork_depth,
                max_json_messages=s.max_json_messages,
                retention=parse_policies(s.retention),
            ),
            events=self._events(),
            engine=Engine(
                s.data_dir,
                map_size=s.lmdb_map_size,
                checkpoint_frames=s.checkpoint_frames,
                checkpoint_seconds=s.checkpoint_interval,
                fault_hook=hook_from_env(os.environ.get("DS_FAULT")),
                replica=replica,
                archive_floor=self.archive.archiver.floor if self.archive is not None else None,
            ),
            gate=gate if self.archive is None else self.archive.store_gate(gate),
        )

    def _events(self) -> StoreEvents:
        """The store's hooks: metrics, and the subscriptions (which wake on commits).

        The hooks run inside the commit pipeline's completion, where an exception
        would strand every request of the batch: a subscription hook that fails
        is logged and skipped, never raised.
        """
        m = self.metrics

        def subs(name: str, *args: object) -> None:
            try:
                getattr(self.subscriptions.manager, name)(*args)
            except Exception:
                log.exception("subscription hook %s failed", name)

        def created(stream: Stream) -> None:
            if m is not None:
                m.streams_created.inc()
                if stream.meta.fork_from is not None:
                    m.forks_created.inc()
            subs("stream_created", stream)

        def deleted(path: str, reason: str) -> None:
            if m is not None:
                m.streams_deleted.labels(reason).inc()
            subs("stream_deleted", path, reason)

        def failed(error: StorageError) -> None:
            if m is not None:
                m.batch_failures.labels("disk_full" if error.disk_full else "error").inc()

        on_batch = m.on_batch if m is not None else None
        return StoreEvents(
            on_batch=on_batch if self.archive is None else self.archive.on_batch(on_batch),
            on_created=created,
            on_appended=lambda stream: subs("stream_appended", stream),
            on_deleted=deleted,
            on_producer=(lambda event: m.producer_events.labels(event).inc())
            if m is not None
            else None,
            on_failure=failed,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.follower is not None:
            await asyncio.to_thread(self.follower.bootstrap)  # before the engine opens
        self.recovery.start()
        if self.follower is not None:
            self.follower.start(ready=self.recovery.recovered)
        tasks = [asyncio.create_task(self._start_subscriptions(), name="subscriptions start")]
        if self.archive is not None:
            tasks.append(asyncio.create_task(self._start_archive(), name="archive start"))
        if self.replication is not None:
            # Only once recovered: its durable position is known, and it can serve.
            work = [
                # Deliveries, wakes and lease expiries only on the primary: a standby
                # would send duplicates and write keyed values it may not (docs/replication.md).
                PrimaryWork("subscriptions", self.subscriptions.resume, self.subscriptions.pause)
            ]
            if self.archive is not None:  # only the primary archives
                work.append(PrimaryWork("archive", self.archive.primary, self.archive.standby))
            self.replication.start(ready=self.recovery.recovered, primary_work=work)
        try:
            yield
        finally:
            if self.replication is not None:
                await self.replication.stop()
            if self.follower is not None:
                await self.follower.stop()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self.archive is not None:
                await self.archive.stop()
            await self.subscriptions.stop()  # no delivery in flight once the store closes
            await self.recovery.stop()
            self._stopped()

    def _stopped(self) -> None:
        """The store is closed: cleanly unless its storage failed closed (the final
        checkpoint is then not taken), which ``serve`` turns into the exit status."""
        if self.store.failed:
            log.error("stopped with storage failed closed: %s", self.store.failed)
        else:
            self.stopped_cleanly = True
            log.info("stopped cleanly")

    async def _start_subscriptions(self) -> None:
        """Start subscriptions once recovery has finished (they read the recovered keyed values).

        Appends committed between the end of recovery and this start are not lost:
        the manager computes pending work from tails and links, at start, every
        stream created after a subscription that matches it.
        """
        if not await self.recovery.recovered():
            return  # recovery failed: the server stops
        try:
            await self.subscriptions.start()
        except Exception as exc:
            self._subscriptions_error = f": {exc}"
            log.exception("subscriptions failed to start; the __ds paths answer 503")

    async def _start_archive(self) -> None:
        """The archive once recovered (``ArchiveService.begin``)."""
        assert self.archive is not None
        if await self.recovery.recovered():
            await self.archive.begin(replicated=self.replication is not None)

    async def archive_status(self, request: Request) -> Response:
        """The archive's state (docs/backup.md): authenticated as the switchover is."""
        if self.replication is not None and (denied := self._peer_denied(request)) is not None:
            return denied
        if self.follower is not None:
            body = self.follower.status()
        else:
            body = OFF_DOCUMENT if self.archive is None else self.archive.status()
        return JSONResponse(body, headers={"cache-control": "no-store"})

    def _recovery_failed(self, error: BaseException) -> None:
        if self.on_fatal is not None:
            self.on_fatal()

    async def hand_over(self) -> None:
        """In a replica set, a primary that begins to stop hands the Lease to a standby
        first (``Replication.hand_over_before_stopping``). Called before uvicorn stops
        listening, while the standbys' streams are still open."""
        if self.replication is not None:
            await self.replication.hand_over_before_stopping()

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

    async def replication_status(self, request: Request) -> JSONResponse:
        """This replica's role, term, primary and positions (docs/replication.md)."""
        assert self.replication is not None
        return JSONResponse(self.replication.status(), headers={"cache-control": "no-store"})

    async def replication_snapshot(self, request: Request) -> Response:
        """A consistent copy of the data, for a standby that must re-copy."""
        assert self.replication is not None
        if (denied := self._peer_denied(request)) is not None:
            return denied
        if not self.recovery.finished:
            return PlainTextResponse("recovery not finished\n", status_code=503)
        path = await self.replication.recopy.serve(request.query_params.get("set", ""))
        if path is None:
            return PlainTextResponse("not the primary\n", status_code=409)
        if not isinstance(path, Path):  # another set's replica (replication/identity.py)
            return Response(path.body, status_code=path.status, headers=path.headers)
        return FileResponse(
            path,
            media_type="application/x-tar",
            background=BackgroundTask(path.unlink, missing_ok=True),
        )

    async def replication_switchover(self, request: Request) -> Response:
        """Hand the primary role to an in-sync standby (docs/replication.md, Switchover)."""
        assert self.replication is not None
        if (denied := self._peer_denied(request)) is not None:
            return denied
        answer = await self.replication.switchover_request(await request.body())
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

    def _peer_denied(self, request: Request) -> Response | None:
        """401 unless the request carries the replica set's token (when it has one)."""
        assert self.replication is not None
        if self.replication.peer_allowed(request.headers.get("authorization")):
            return None
        return JSONResponse(
            peer_token.REFUSED,
            status_code=401,
            headers={"www-authenticate": peer_token.CHALLENGE},
        )

    async def metrics_endpoint(self, request: Request) -> Response:
        assert self.metrics is not None
        # Scrape-time gauges stat the data directory: keep that off the event loop.
        body = await asyncio.to_thread(self.metrics.exposition)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

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
        elif not self.subscriptions.started:
            problems.append(f"subscriptions not started{self._subscriptions_error}")
        if self.store.failed:
            problems.append(f"storage failed closed: {self.store.failed}")
        if self.follower is not None and (stuck := self.follower.unready()) is not None:
            problems.append(stuck)  # a replica cluster's server that cannot apply
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


def protocol_settings(s: Settings) -> ProtocolSettings:
    """What the protocol handlers read, from the settings' one home."""
    return ProtocolSettings(
        base_path=s.base_path,
        long_poll_timeout=s.long_poll_timeout,
        sse_reconnect_interval=s.sse_reconnect_interval,
        max_body_bytes=s.max_body_bytes,
        max_read_bytes=s.max_read_bytes,
        max_path_bytes=s.max_path_bytes,
        slow_append_seconds=s.slow_append_seconds,
        max_live_readers=s.max_live_readers,
        max_live_readers_per_client=s.max_live_readers_per_client,
        body_timeout=s.body_timeout,
        min_body_rate=s.min_body_rate,
    )


def subscription_settings(s: Settings) -> SubscriptionSettings:
    """What the subscriptions read, from the settings' one home."""
    return SubscriptionSettings(
        data_dir=s.data_dir,
        base_path=s.base_path,
        public_url=s.public_url,
        max_path_bytes=s.max_path_bytes,
        max_subscriptions=s.max_subscriptions,
        webhook_allow=tuple(s.webhook_allow),
        webhook_timeout=s.webhook_timeout,
        webhook_ca_file=s.webhook_ca_file,
        webhook_key_replay_window=s.webhook_key_replay_window,
        webhook_key_rotation_interval=s.webhook_key_rotation_interval,
    )
