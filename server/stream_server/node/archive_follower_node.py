"""A replica cluster's server as a ``Topology`` (its own module, imported by
``node/modes.py`` only for a node that follows an archive)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from stream_server.archive.follow.replica_cluster import ArchiveFollower
from stream_server.config import Settings
from stream_server.engine.replica import ReplicaHooks
from stream_server.node.archive_follower_part import FollowerPart
from stream_server.node.part import Part
from stream_server.node.store_factory import StoreFactory
from stream_server.node.topology import Ready, Topology
from stream_server.protocol.refusal import Refusal
from stream_server.replication.primary_work import PrimaryWork


class ArchiveFollowerNode(Topology):
    """A replica cluster's server (--archive-follow, docs/replica-clusters.md): it applies
    another cluster's archive on a standby's engine hooks and refuses every write."""

    primary_only = True
    gated = True
    archives = False
    refuses_writes = True
    follower: ArchiveFollower

    def __init__(self, settings: Settings, build: StoreFactory) -> None:
        self.settings = settings
        hooks = ReplicaHooks()
        self.store = build(hooks)
        self.follower = ArchiveFollower.from_settings(settings, self.store, hooks)

    def parts(self, recovered: Callable[[], bool]) -> Sequence[Part]:
        return [FollowerPart(self.follower)]

    async def write_refusal(self) -> Refusal | None:
        return self.follower.refusal()

    def writes_open(self) -> bool:
        return False

    def opened(self) -> Callable[[], None] | None:
        """It finds where it resumes."""
        return self.follower.opened

    async def before_open(self) -> None:
        """An empty directory gets the newest base backup, off the loop."""
        await asyncio.to_thread(self.follower.bootstrap)

    def start(self, recovered: Ready, primary_work: list[PrimaryWork]) -> None:
        self.follower.start(ready=recovered)

    async def stop(self) -> None:
        await self.follower.stop()
