"""What a node is in its cluster: one ``Topology`` subclass per mode.

The mode decides how the store is built (a replica set's engine hooks and ack
gate, a follower's read-only hooks), which reads and writes are let through, what
runs once the engine is open, and when the primary-only work runs. Those are the
questions whose answers used to be branches on the mode all through the app; here
each mode answers them once. The Parts a mode brings (its endpoints, its status)
come from ``parts``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from stream_server.archive.follow_position import promote
from stream_server.config import Settings
from stream_server.engine.replica import ReplicaHooks
from stream_server.node.part import Part
from stream_server.node.store_factory import StoreFactory
from stream_server.protocol.context import ReadGate
from stream_server.protocol.refusal import Refusal
from stream_server.replication.identity import leave
from stream_server.replication.primary_work import PrimaryWork
from stream_server.streams.store import StreamStore

if TYPE_CHECKING:
    from stream_server.archive.follow.replica_cluster import ArchiveFollower
    from stream_server.replication.replica_set import Replication

Ready = Callable[[], Awaitable[bool]]


class Topology:
    """What every mode answers unless it says otherwise; a mode is one subclass."""

    # Primary-only work (deliveries, archiving) waits to be told it is primary.
    primary_only: ClassVar[bool] = False
    # Its gates may refuse or hold a request: a worker relays those to the writer.
    gated: ClassVar[bool] = False
    # It archives its own WAL (a follower's archive is its source's).
    archives: ClassVar[bool] = True
    refuses_writes = False
    read_gate: ReadGate | None = None
    # Who may call the admin and peer endpoints; None: anyone (a single node's rule).
    peer_allowed: Callable[[str | None], bool] | None = None
    # The term history of its WAL, where a replica set keeps it.
    term_hooks: ReplicaHooks | None = None
    # The mode's own objects, for what reaches into them (the workers' writer, tests).
    replication: Replication | None = None
    follower: ArchiveFollower | None = None

    def __init__(self, settings: Settings, build: StoreFactory) -> None:
        self.settings = settings
        self.store: StreamStore = build()

    def parts(self, recovered: Callable[[], bool]) -> Sequence[Part]:
        """The Parts this mode brings (``recovered``: whether recovery has finished)."""
        return ()

    async def write_refusal(self) -> Refusal | None:
        return None

    def writes_open(self) -> bool:
        """Whether a write is taken at once, without asking ``write_refusal``."""
        return True

    def opened(self) -> Callable[[], None] | None:
        """What runs once the engine is open, before anything is written."""
        return None

    async def before_open(self) -> None:
        """Before recovery opens the engine."""

    def start(self, recovered: Ready, primary_work: list[PrimaryWork]) -> None:
        """Once the lifespan starts: run ``primary_work`` while primary, where the mode
        has primaries; else the Parts' own start runs it."""

    async def stop(self) -> None:
        """First at shutdown, before the Parts stop."""

    async def hand_over(self) -> None:
        """When the server begins to stop, while it still listens."""


class SingleNode(Topology):
    """One server on its own: it archives under its own term, and runs every Part's
    work from the Parts' own start."""

    def opened(self) -> Callable[[], None] | None:
        """What runs once the engine is open, before anything is written: a single node
        on a set member's directory leaves the set, and on a directory that followed an
        archive it is promoted (``archive/follow_position.py``) first, since that may
        refuse the start."""
        engine, url = self.store.engine, self.settings.archive_url

        def single_node() -> None:
            promote(engine, url)
            leave(engine)

        return single_node
