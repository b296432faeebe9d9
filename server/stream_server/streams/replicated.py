"""What replication may change in the stream layer, and nothing more.

A standby's stream layer is not changed by requests but by the primary's
frames (``replication/standby/mirror.py`` reads their metadata changes), and a replica
that stops being primary drops what it had queued. Those are the only ways
replication changes streams, so they are named here, on the stream layer's
side, instead of replication editing the store's table, its expiry index and
its id counter: the store can change how it keeps them without replication
noticing, and what a standby may do to the stream layer reads in one place.
"""

from __future__ import annotations

from collections.abc import Mapping

from stream_format.meta import StreamMeta
from stream_server.streams.model import Stream
from stream_server.streams.store import StreamStore


class ReplicatedStreams:
    """The stream layer as a standby's replication changes it."""

    __slots__ = ("_store",)

    def __init__(self, store: StreamStore) -> None:
        self._store = store

    @property
    def held(self) -> dict[int, int | None]:
        """Stream id -> the tail its readers may see, for streams whose tail in the engine
        is ahead of it (a standby's frames past the commit point; None: a stream such a
        frame created, not to be seen). A stream loaded meanwhile takes this tail
        (``StreamStore.held``); the mirror keeps it (``replication/standby/mirror.py``)."""
        return self._store.held

    @property
    def by_path(self) -> Mapping[str, Stream]:
        """Every stream loaded so far, by path (read only: change them through the
        methods). One not loaded needs nothing from a frame: it is loaded from LMDB,
        which the frame's commit changed, when it is first asked for."""
        return self._store.table.by_path

    def put(self, path: str, meta: StreamMeta) -> Stream:
        """A stream's committed metadata from a frame: the stream at ``path`` updated
        (loaded first, producers and all, if it was not), or made (its committed tail
        from the engine) when there is none with this id. The caller wakes its readers
        once the frame's other changes are in."""
        table = self._store.table
        table.hidden.discard(path)  # published now
        s = table.get(path)
        if s is None or s.id != meta.id:
            s = Stream(path, meta, self._store.loaded_tail(meta), committed=True)
            table.add(s)
        s.meta = meta
        self._store.expiry.track(s)
        return s

    def remove(self, path: str) -> Stream | None:
        """A stream deleted by a frame: gone, its readers woken (they find it gone)."""
        gone = self._store.table.by_path.pop(path, None)
        if gone is not None:
            gone.notify()
        return gone

    def ids_from(self, next_id: int) -> None:
        """The primary's id counter: ids below ``next_id`` are taken, here too."""
        self._store.next_id = max(self._store.next_id, next_id)

    def rollback(self) -> None:
        """Drop every queued change of this replica's own: it stopped being primary,
        and they will never be published."""
        self._store.table.rollback()
