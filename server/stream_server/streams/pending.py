"""Pending state: what the streams will look like once the queued batch is durable.

Writers validate against pending state, which runs ahead of the committed
state by the operations queued for the next group commit. Two things are
pending: each stream's own fields (``model.Pending``, beside the stream that
holds them: configuration, tail and the producers it has accepted), and which
streams exist (``StreamTable``, here: creates not yet durable are in the table
already, deletes not yet durable are out of it but still reachable for fork
reads). A batch that fails undoes both in one place, ``StreamTable.rollback``,
so the store never has to remember what a failed request had reserved.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from stream_server.engine.ops import Op
from stream_server.streams.model import Stream

# References to a stream the table's eviction pass itself holds: ``by_path``'s, its
# local name, and ``sys.getrefcount``'s argument. Any more, and someone (a request in
# flight, a replica's index) still uses the object: it stays, so that no two objects
# ever stand for one stream.
_ONLY_HERE = 3


def _idle(s: Stream) -> bool:
    """Nothing of ``s`` lives only in memory: committed, nothing queued or in flight,
    no reader waiting, no TTL clock to persist."""
    return (
        s.committed
        and not s.waiters
        and (s.inflight is None or s.inflight.done())
        and not s.queued()
        and s.meta.ttl is None
    )


class StreamTable:
    """The streams by path: those loaded (``by_path``), the rest loaded from LMDB the
    first time they are asked for, and those whose deletion is queued but not durable.

    A server holds a million streams, few of them busy: a start loads none of them
    (``load`` reads a committed stream's configuration and producers when ``get``
    first names it), and what a stream costs in memory is paid once it is used.

    A queued delete takes a stream out of ``by_path`` at once (a new request sees
    it gone), yet forks keep reading through it until the delete is durable,
    so ``find`` still returns it. ``hidden`` are the paths of streams created by
    batches that never passed the ack gate (``rollback``): LMDB may hold them, but
    no reader may see them until the replication layer publishes them (``put``).
    """

    __slots__ = ("_count", "_load", "_next_pass", "by_path", "deleting", "hidden", "hot")

    def __init__(
        self,
        load: Callable[[str], Stream | None],
        count: Callable[[], int],
        hot: int = 4096,
    ) -> None:
        self.by_path: dict[str, Stream] = {}  # loaded, least recently asked for first
        self.deleting: dict[str, Stream] = {}
        self.hidden: set[str] = set()
        self._load = load
        self._count = count
        self.hot = hot  # how many loaded streams to keep: past it, idle ones are dropped
        self._next_pass = hot

    def get(self, path: str) -> Stream | None:
        """The stream at ``path`` (not one whose delete is queued), loaded if need be."""
        by_path = self.by_path
        s = by_path.get(path)
        if s is not None:  # most recently asked for: the last to go
            del by_path[path]
            by_path[path] = s
            return s
        if path in self.deleting or path in self.hidden:
            return None
        s = self._load(path)
        if s is not None:
            by_path[path] = s
            if len(by_path) > self._next_pass:
                self._evict()
        return s

    def _evict(self) -> None:
        """Drop the least recently asked-for idle streams down to 7/8 of ``hot``; the
        next pass comes an eighth of ``hot`` loads later, whatever this one managed
        (streams in use stay, however many)."""
        by_path = self.by_path
        keep = self.hot - self.hot // 8
        for path in list(by_path):
            if len(by_path) <= keep:
                break
            s = by_path[path]
            if _idle(s) and sys.getrefcount(s) <= _ONLY_HERE:
                del by_path[path]
        self._next_pass = len(by_path) + max(self.hot // 8, 1)

    def find(self, path: str) -> Stream | None:
        """The stream at ``path``, including one whose delete is still queued."""
        return self.get(path) or self.deleting.get(path)

    def add(self, s: Stream) -> None:
        """A stream made here (a create being queued, or one a frame brought)."""
        self.by_path[s.path] = s
        self.hidden.discard(s.path)
        if len(self.by_path) > self._next_pass:
            self._evict()

    def count(self) -> int:
        """How many committed streams there are, queued deletes not counted (one LMDB
        page read: a metrics scrape must not walk a million streams)."""
        return max(self._count() - len(self.deleting), 0)

    def queue_delete(self, s: Stream) -> None:
        self.by_path.pop(s.path, None)
        self.deleting[s.path] = s

    def delete_durable(self, s: Stream) -> None:
        if self.deleting.get(s.path) is s:
            del self.deleting[s.path]

    def rollback(self) -> None:
        """A batch failed: every queued change is forgotten, as if never asked."""
        for path, s in list(self.by_path.items()):
            if not s.committed:
                del self.by_path[path]
                self.hidden.add(path)
                if s.created is not None and not s.created.done():
                    s.created.set_result(False)
            else:
                s.reset_pending()
        for path, s in self.deleting.items():
            s.reset_pending()
            self.by_path[path] = s
        self.deleting.clear()


class AllStreams(Mapping[str, Stream]):
    """Every stream by path, as a read-only mapping over a ``StreamTable``: a lookup
    loads one stream; going through them all loads each (subscriptions' globs do)."""

    __slots__ = ("_paths", "_table")

    def __init__(self, table: StreamTable, paths: Callable[[], Iterator[str]]) -> None:
        self._table = table
        self._paths = paths  # every committed stream's path, from LMDB

    def __getitem__(self, path: str) -> Stream:
        s = self._table.get(path)
        if s is None:
            raise KeyError(path)
        return s

    def __iter__(self) -> Iterator[str]:
        new = [path for path, s in list(self._table.by_path.items()) if not s.committed]
        yield from new
        skip = set(new)
        for path in self._paths():
            if path not in skip and self._table.get(path) is not None:
                yield path

    def __len__(self) -> int:
        return self._table.count()


@dataclass(slots=True)
class Queued:
    """A change reserved in pending state: its ops, and what its commit makes visible.

    ``apply`` runs on the loop once the batch carrying ``ops`` is durable;
    ``size`` is the payload bytes, ``tail`` the stream's pending tail after it.
    """

    ops: list[Op]
    size: int
    tail: int
    apply: Callable[[], None]
