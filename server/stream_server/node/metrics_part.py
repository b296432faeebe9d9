"""``/metrics`` as a Part: the series the store's events and state feed, bound to the
running node at its build; None without ``--metrics``.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from stream_server.engine import StorageError
from stream_server.metrics import Metrics
from stream_server.node.service_part import Node, ServicePart
from stream_server.streams.model import Stream
from stream_server.streams.store_options import StoreEvents


class MetricsPart(ServicePart):
    """``/metrics`` and the series the store's events and state feed."""

    @classmethod
    def build(cls, node: Node) -> MetricsPart | None:
        return cls(node, node.metrics) if node.metrics is not None else None

    def __init__(self, node: Node, metrics: Metrics) -> None:
        self.metrics = m = metrics
        store, recovery, live = node.store, node.recovery, node.reader_slots.by_mode
        m.bind(
            streams=lambda: len(store.streams),
            live=lambda mode: live[mode],
            data_dir=str(node.settings.data_dir),
            segment_bytes=lambda: sum(  # records held: retention's holes excluded
                t.file_len - t.start_pos for t in list(store.engine.tails.values())
            ),
            ready=lambda: store.ready and not store.failed,
            failed=lambda: bool(store.failed),
            recovering=lambda: recovery.running,
            recovery=recovery.progress,
            recovery_seconds=recovery.seconds,
            startup_seconds=recovery.startup_seconds,
            recovery_interrupted=lambda: recovery.interrupted,
        )
        m.bind_retention(
            reclaimed=lambda: store.engine.reclaimed_bytes, policies=store.retention.stats
        )

    def routes(self) -> list[BaseRoute]:
        return [Route("/metrics", self.exposition, methods=["GET"])]

    def listener(self) -> StoreEvents:
        m = self.metrics

        def created(stream: Stream) -> None:
            m.streams_created.inc()
            if stream.meta.fork_from is not None:
                m.forks_created.inc()

        def failed(error: StorageError) -> None:
            m.batch_failures.labels("disk_full" if error.disk_full else "error").inc()

        return StoreEvents(
            on_batch=m.on_batch,
            on_created=created,
            on_deleted=lambda _path, reason: m.streams_deleted.labels(reason).inc(),
            on_producer=lambda event: m.producer_events.labels(event).inc(),
            on_failure=failed,
        )

    async def exposition(self, request: Request) -> Response:
        # Scrape-time gauges stat the data directory: keep that off the event loop.
        body = await asyncio.to_thread(self.metrics.exposition)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
