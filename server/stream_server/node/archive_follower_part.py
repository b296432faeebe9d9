"""A replica cluster's follower of another cluster's archive as a Part: its status at
``/_archive/status``, its series, and its readiness (docs/replica-clusters.md). Its
start and stop are its topology's (``ArchiveFollowerNode``): it opens before the engine.
"""

from __future__ import annotations

from prometheus_client.registry import Collector
from starlette.routing import BaseRoute

from stream_server.archive.follow.replica_cluster import ArchiveFollower
from stream_server.node.admin import status_route
from stream_server.node.part import Part


class FollowerPart(Part):
    def __init__(self, follower: ArchiveFollower) -> None:
        self.follower = follower

    def routes(self) -> list[BaseRoute]:
        return [status_route(self.follower.status, None)]

    def collectors(self) -> list[Collector]:
        return [self.follower.collector]

    def unready(self) -> str | None:
        """A follower that cannot apply what it reads."""
        return self.follower.unready()
