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

from collections.abc import Callable
from dataclasses import dataclass

from stream_server.engine.ops import Op
from stream_server.streams.model import Stream


class StreamTable:
    """Every stream by path, and the streams whose deletion is queued but not durable.

    A queued delete takes a stream out of ``by_path`` at once (a new request sees
    it gone), yet forks keep reading through it until the delete is durable,
    so ``find`` still returns it.
    """

    __slots__ = ("by_path", "deleting")

    def __init__(self) -> None:
        self.by_path: dict[str, Stream] = {}
        self.deleting: dict[str, Stream] = {}

    def find(self, path: str) -> Stream | None:
        """The stream at ``path``, including one whose delete is still queued."""
        return self.by_path.get(path) or self.deleting.get(path)

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
                if s.created is not None and not s.created.done():
                    s.created.set_result(False)
            else:
                s.reset_pending()
        for path, s in self.deleting.items():
            s.reset_pending()
            self.by_path[path] = s
        self.deleting.clear()


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
