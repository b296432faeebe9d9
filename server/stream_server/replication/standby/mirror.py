"""A standby's stream layer, kept equal to what its engine holds up to the commit point.

The engine of a standby applies the primary's frames (``engine.replica``); the
stream layer's in-memory view (streams, committed tails, producers) is then
refreshed from the same metadata changes, but only for frames at or below the
commit point the primary announced: a reader on a standby never sees a write
that could still be rolled back. Producer state travels in the same frames,
so a producer that retries on a promoted standby gets the duplicate answer.

A stream the stream layer does not hold loaded (none are after a start, and the
hot set drops idle ones) is loaded from LMDB when first asked for, where a frame
past the commit point already is: for every stream such a frame changed, the tail
its readers may see is kept (``held``: the tail before the first such frame, then
each published frame's) until the commit point covers them all, and a load takes
that one (``ReplicatedStreams.held``); None keeps a stream a staged frame created
out of sight.

Streams are found by id through an index kept across publishes (a standby
applies a frame per batch of the primary, and rebuilding an index of every
stream each time would cost in proportion to the streams held); an entry
the table no longer holds is noticed and the index rebuilt.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterable

from stream_format import wal
from stream_format.meta import (
    DB_INFO,
    DB_PRODUCERS,
    DB_STREAMS,
    DB_TAILS,
    KEY_NEXT_STREAM_ID,
    PRODUCER,
    U64,
    StreamMeta,
    decode_tail,
    key_producer,
    key_stream_id,
    stream_path,
)
from stream_format.records import Producer
from stream_server.engine.prior_tails import Prior
from stream_server.engine.replica import frame_changes
from stream_server.streams.model import Stream
from stream_server.streams.replicated import ReplicatedStreams


class Mirror:
    def __init__(self, streams: ReplicatedStreams, lsn: Callable[[], int]) -> None:
        """``streams``: the stream layer as replication may change it; ``lsn``: the last
        lsn the engine holds (nothing past it can be published)."""
        self.streams = streams
        self.lsn = lsn
        self.staged: deque[tuple[int, list[wal.Entry]]] = deque()  # (lsn, changes) not visible yet
        self.published = 0  # the last lsn readers here may see
        # Stream id -> the tail its readers may see while staged frames changed it (module
        # doc), shared with the stream layer's loads; and the last such frame's lsn.
        self.held = streams.held
        self._held_until: dict[int, int] = {}
        # Weak: the stream table decides which streams stay loaded (its hot set); one it
        # dropped needs nothing from a frame, LMDB has it when it is loaded again.
        self._by_id: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
        self._rebuilt = False  # the index was rebuilt during this publish
        # The changes to each database the stream layer keeps, by database number.
        self._apply: dict[int, Callable[[wal.Entry, set[Stream]], None]] = {
            DB_STREAMS: self._stream_change,
            DB_TAILS: self._tail_change,
            DB_PRODUCERS: self._producer_change,
            DB_INFO: self._info_change,
        }

    def stage(self, lsn: int, changes: list[wal.Entry], prior: Prior | None = None) -> None:
        """A frame applied here, visible once a commit point covers it; ``prior``: the
        tails it replaced (``engine.prior_tails``), which its streams' loads show until
        then."""
        self.staged.append((lsn, changes))
        for sid, unit in (prior or {}).items():
            self.held.setdefault(sid, unit)
            self._held_until[sid] = lsn

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
            self._refresh(lsn, changes)
            self.published = lsn
        self.published = max(self.published, min(upto, self.lsn()))

    def _release(self, lsn: int, entry: wal.Entry) -> None:
        """A published frame's tail change: the tail a load shows moves to it, and is
        LMDB's again once no staged frame changed the stream past it."""
        sid = key_stream_id(entry[2])
        until = self._held_until.get(sid)
        if until is None:
            return
        if until <= lsn:
            del self._held_until[sid]
            self.held.pop(sid, None)
        else:
            self.held[sid] = decode_tail(entry[3]).unit if entry[0] == wal.PUT else None

    def _stream(self, sid: int) -> Stream | None:
        """The stream with id ``sid`` in the table, if any, through the index."""
        s = self._by_id.get(sid)
        if s is not None and self.streams.by_path.get(s.path) is s:
            return s
        if self._rebuilt:  # at most once per publish: a stream that is not there stays so
            return None
        # Stale or missing: the table changed by other means (a role switch's rollback).
        self._by_id = weakref.WeakValueDictionary({s.id: s for s in self.streams.by_path.values()})
        self._rebuilt = True
        return self._by_id.get(sid)

    def _refresh(self, lsn: int, changes: list[wal.Entry]) -> None:
        """Apply one frame's changes to the stream layer, keeping the index current,
        then wake the readers of every stream it touched."""
        touched: set[Stream] = set()
        for entry in changes:
            if entry[1] == DB_TAILS and self._held_until:
                self._release(lsn, entry)
            apply = self._apply.get(entry[1])
            if apply is not None:
                apply(entry, touched)
        for s in touched:
            s.reset_pending()
            s.notify()

    def _stream_change(self, entry: wal.Entry, touched: set[Stream]) -> None:
        path = stream_path(entry[2])
        if entry[0] == wal.PUT:
            meta = StreamMeta.from_json(entry[3])
            s = self.streams.put(path, meta)
            self._by_id[meta.id] = s
            touched.add(s)
            return
        gone = self.streams.remove(path)
        if gone is not None:
            self._by_id.pop(gone.id, None)

    def _tail_change(self, entry: wal.Entry, touched: set[Stream]) -> None:
        if entry[0] != wal.PUT:
            return
        s = self._stream(key_stream_id(entry[2]))
        if s is not None:
            s.tail = decode_tail(entry[3]).unit
            touched.add(s)

    def _producer_change(self, entry: wal.Entry, touched: set[Stream]) -> None:
        sid, pid = key_producer(entry[2])
        s = self._stream(sid)
        if s is None:
            return
        if entry[0] == wal.PUT:
            epoch, seq = PRODUCER.unpack(entry[3])
            s.producers.pop(pid, None)  # recency order: the newest last
            s.producers[pid] = Producer(pid, epoch, seq)
        elif entry[0] == wal.DELETE:
            s.producers.pop(pid, None)
        else:  # DELETE_PREFIX: every producer of the stream
            s.producers.clear()

    def _info_change(self, entry: wal.Entry, touched: set[Stream]) -> None:
        if entry[0] == wal.PUT and entry[2] == KEY_NEXT_STREAM_ID:
            self.streams.ids_from(U64.unpack(entry[3])[0])
