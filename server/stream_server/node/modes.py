"""Which ``Topology`` the settings ask for.

A mode's module is imported only when the node runs in that mode: a single node,
which most servers are, does not load a replica set's Lease client, role loop, shipper
and recopy: a quarter of a start's CPU (docs/performance.md, "The test suite's time";
``e2e/start_cpu.py`` measures it).
"""

from __future__ import annotations

from stream_server.config import Settings
from stream_server.node.topology import SingleNode, Topology


def topology_of(settings: Settings) -> type[Topology]:
    """The mode the settings ask for."""
    if settings.replication_lease:
        from stream_server.node.replica_set_member import ReplicaSetMember

        return ReplicaSetMember
    if settings.archive_follow:
        from stream_server.node.archive_follower_node import ArchiveFollowerNode

        return ArchiveFollowerNode
    return SingleNode
