"""A standby's stream layer, kept equal to what its engine holds up to the commit point.

The engine of a standby applies the primary's frames (``engine.replica``); the
stream layer's in-memory view (streams, committed tails, producers) is then
refreshed from the same metadata changes, but only for frames at or below the
commit point the primary announced: a reader on a standby never sees a write
that could still be rolled back. Producer state travels in the same frames,
so a producer that retries on a promoted standby gets the duplicate answer.

Streams are found by id through an index kept across publishes (a standby
applies a frame per batch of the primary, and rebuilding an index of every
stream each time would cost in proportion to the streams held); an entry
the table no longer holds is noticed and the index rebuilt.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from stream_format import wal
from stream_format.meta import (
    DB_INFO,
    DB_PRODUCERS,
    DB_STREAMS,
    DB_TAILS,
    KEY_NEXT_STREAM_ID,
    PRODUCER,
    U64,
    U64_BE,
    StreamMeta,
    decode_tail,
    stream_path,
)
from stream_format.records import Producer
from stream_server.engine.replica import frame_changes
from stream_server.streams.model import Stream
from stream_server.streams.store import StreamStore


class Mirror:
    def __init__(self, store: StreamStore) -> None:
        self.store = store
        self.staged: deque[tuple[int, list[wal.Entry]]] = deque()  # (lsn, changes) not visible yet
        self.published = 0  # the last lsn readers here may see
        self._by_id: dict[int, Stream] = {}
        self._rebuilt = False  # the index was rebuilt during this publish

    def stage(self, lsn: int, changes: list[wal.Entry]) -> None:
        self.staged.append((lsn, changes))

    def stage_frames(
        self, published: int, lsn: int, frames: Iterable[tuple[int, int, bytes]]
    ) -> bool:
        """Frames (term, lsn, frame) this replica wrote as primary up to ``lsn`` whose
        changes the stream layer dropped (they never passed the gate): readers see up
        to ``published`` now, and the frames once a commit point covers them (or this
        replica leads again, as every frame it holds). False when ``frames`` did not
        reach ``lsn`` (older ones are no longer held)."""
        self.published = published
        for _, at, frame in frames:
            self.stage(*frame_changes(frame))
            published = at
        return published >= lsn

    def publish(self, upto: int) -> None:
        """Make every staged frame at or below ``upto`` visible to readers, in order."""
        self._rebuilt = False
        while self.staged and self.staged[0][0] <= upto:
            lsn, changes = self.staged.popleft()
            self._refresh(changes)
            self.published = lsn
        self.published = max(self.published, min(upto, self.store.engine.lsn))

    def _stream(self, sid: int) -> Stream | None:
        """The stream with id ``sid`` in the table, if any, through the index."""
        s = self._by_id.get(sid)
        if s is not None and self.store.table.by_path.get(s.path) is s:
            return s
        if self._rebuilt:  # at most once per publish: a stream that is not there stays so
            return None
        # Stale or missing: the table changed by other means (a role switch's rollback).
        self._by_id = {s.id: s for s in self.store.table.by_path.values()}
        self._rebuilt = True
        return self._by_id.get(sid)

    def _refresh(self, changes: list[wal.Entry]) -> None:
        """Apply one frame's changes to the stream layer, keeping the index current."""
        table = self.store.table
        touched: set[Stream] = set()
        for entry in changes:
            kind, db, key = entry[0], entry[1], entry[2]
            if db == DB_STREAMS:
                path = stream_path(key)
                if kind == wal.PUT:
                    meta = StreamMeta.from_json(entry[3])
                    s = table.by_path.get(path)
                    if s is None or s.id != meta.id:
                        tail = self.store.engine.tails.get(meta.id)
                        s = Stream(
                            path, meta, tail.unit if tail else meta.fork_offset, committed=True
                        )
                        table.by_path[path] = s
                        self.store.expiry.track(s)
                    else:
                        s.meta = meta
                    self._by_id[meta.id] = s
                    touched.add(s)
                else:
                    gone = table.by_path.pop(path, None)
                    if gone is not None:
                        self._by_id.pop(gone.id, None)
                        gone.notify()
            elif db == DB_TAILS and kind == wal.PUT:
                s = self._stream(U64_BE.unpack(key)[0])
                if s is not None:
                    s.tail = decode_tail(entry[3]).unit
                    touched.add(s)
            elif db == DB_PRODUCERS:
                s = self._stream(U64_BE.unpack(key[:8])[0])
                if s is None:
                    continue
                if kind == wal.PUT:
                    pid = bytes(key[8:]).decode("utf-8", "surrogatepass")
                    epoch, seq = PRODUCER.unpack(entry[3])
                    s.producers.pop(pid, None)  # recency order: the newest last
                    s.producers[pid] = Producer(pid, epoch, seq)
                elif kind == wal.DELETE:
                    s.producers.pop(bytes(key[8:]).decode("utf-8", "surrogatepass"), None)
                else:
                    s.producers.clear()
            elif db == DB_INFO and kind == wal.PUT and key == KEY_NEXT_STREAM_ID:
                self.store.next_id = max(self.store.next_id, U64.unpack(entry[3])[0])
        for s in touched:
            s.reset_pending()
            s.notify()
