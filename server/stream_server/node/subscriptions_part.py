"""Subscriptions (docs/subscriptions.md) as a Part: woken by the store's events, started
once recovery has finished (they read the recovered keyed values), delivering only
while primary on a replica set's member, stopped before the store closes so that no
delivery is in flight then.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from stream_server.node.service_part import Node, ServicePart
from stream_server.replication.primary_work import PrimaryWork
from stream_server.streams.store_options import StoreEvents
from stream_server.subscriptions.service import Subscriptions

log = logging.getLogger("stream_server")


class SubscriptionsPart(ServicePart):
    def __init__(self, node: Node) -> None:
        self.subscriptions = Subscriptions(
            node.store,
            node.settings,
            node.metrics,
            data_dir=node.settings.data_dir,
            base_path=node.settings.base_path,
            max_path_bytes=node.settings.max_path_bytes,
            primary_only=node.kind.primary_only,
        )
        self.error = ""
        manager = self.subscriptions.manager
        if node.metrics is not None:
            node.metrics.bind_subscriptions(
                pending_streams=manager.pending_stream_count, failing=manager.failing_count
            )

    def listener(self) -> StoreEvents:
        """The manager's hooks, each logged and skipped if it fails (``node/store_factory.py``)."""

        def tell(name: str, *args: Any) -> None:
            try:
                getattr(self.subscriptions.manager, name)(*args)
            except Exception:
                log.exception("subscription hook %s failed", name)

        return StoreEvents(
            on_created=partial(tell, "stream_created"),
            on_appended=partial(tell, "stream_appended"),
            on_deleted=partial(tell, "stream_deleted"),
        )

    async def start(self) -> None:
        """Appends committed between the end of recovery and this start are not lost:
        the manager computes pending work from tails and links, at start, every
        stream created after a subscription that matches it."""
        try:
            await self.subscriptions.start()
        except Exception as exc:
            self.error = f": {exc}"
            log.exception("subscriptions failed to start; the __ds paths answer 503")

    def not_started(self) -> str | None:
        if self.subscriptions.started:
            return None
        return f"subscriptions not started{self.error}"

    def primary_work(self) -> PrimaryWork:
        """Deliveries, wakes and lease expiries only on the primary: a standby would
        send duplicates and write keyed values it may not (docs/replication.md)."""
        s = self.subscriptions
        return PrimaryWork("subscriptions", s.resume, s.pause)

    async def stop(self) -> None:
        await self.subscriptions.stop()
