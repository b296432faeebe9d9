"""What a service Part is built from (``Node``), and how the app builds them
(``ServicePart.build``), so that one list in the app names every service.

A Part that shapes the store (``shapes_store``: the archive's floor and gate) is
built before it, and may reach the store and the topology only in what it calls
later; every other Part is built once the store, the recovery and the live
readers' slots exist.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, TypeVar

from stream_server.background_recovery import BackgroundRecovery
from stream_server.config import Settings
from stream_server.metrics import Metrics
from stream_server.node.part import Part
from stream_server.node.topology import Topology
from stream_server.protocol.live import ReaderSlots
from stream_server.streams.store import StreamStore

P = TypeVar("P", bound=Part)


class Node(Protocol):
    """The node being assembled (``StreamServerApp``), as its Parts see it."""

    @property
    def settings(self) -> Settings: ...
    @property
    def kind(self) -> type[Topology]: ...
    @property
    def metrics(self) -> Metrics | None: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def store(self) -> StreamStore: ...
    @property
    def recovery(self) -> BackgroundRecovery: ...
    @property
    def reader_slots(self) -> ReaderSlots: ...

    def part(self, kind: type[P]) -> P | None:
        """The Part of that class built so far, if any."""


class ServicePart(Part):
    """A service the app lists: it builds itself from the node, or answers None where
    it does not apply (the settings leave it off, the topology has no use for it)."""

    shapes_store: ClassVar[bool] = False

    def __init__(self, node: Node) -> None:
        self.node = node

    @classmethod
    def build(cls, node: Node) -> Part | None:
        return cls(node)
