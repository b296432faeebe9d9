"""A replica set's member as a ``Topology`` (its own module: a single node never loads
the set's Lease client, role loop, shipper and recopy; ``node/modes.py`` imports it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stream_server.config import Settings
from stream_server.node.part import Part
from stream_server.node.replication import ReplicationPart
from stream_server.node.store_factory import StoreFactory
from stream_server.node.topology import Ready, Topology
from stream_server.protocol.refusal import Refusal
from stream_server.replication.primary_work import PrimaryWork
from stream_server.replication.replica_set import Replication


class ReplicaSetMember(Topology):
    """A replica set's member (docs/replication.md): the set's hooks and ack gate, its
    write fence and read gate, and the primary work run only while primary."""

    primary_only = True
    gated = True
    replication: Replication

    def __init__(self, settings: Settings, build: StoreFactory) -> None:
        self.settings = settings
        self.replication = r = Replication(settings, build)
        self.store = r.store
        self.read_gate = r.read_fence
        self.peer_allowed = r.peer_allowed
        self.term_hooks = r.hooks
        self.refuses_writes = True

    def parts(self, recovered: Callable[[], bool]) -> Sequence[Part]:
        return [ReplicationPart(self.replication, recovered)]

    async def write_refusal(self) -> Refusal | None:
        return await self.replication.writes.refusal()

    def writes_open(self) -> bool:
        return self.replication.writes.open

    def start(self, recovered: Ready, primary_work: list[PrimaryWork]) -> None:
        """Only once recovered: its durable position is known, and it can serve."""
        self.replication.start(ready=recovered, primary_work=primary_work)

    async def stop(self) -> None:
        await self.replication.stop()

    async def hand_over(self) -> None:
        """A primary that begins to stop hands the Lease to a standby first
        (``Replication.hand_over_before_stopping``)."""
        await self.replication.hand_over_before_stopping()
