"""Retention's part of the engine: where a drop may move a stream's retained start.

Retention (``streams/retention.py``) decides which streams are over their
policies; the engine answers how far each may drop: ``retention_point`` walks
record headers from the index entry at or below a file position (never the
payloads), ``first_record_time`` reads the oldest retained record's commit
time. A drop (``ops.DropHead``) then commits like any batch, and names the
index entries below its new start (``resolve``) so that the same batch
deletes them; the blocks below it are given back once it is durable (the
engine's publish step calls ``punch``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stream_format.meta import DB_INDEX, index_key
from stream_format.records import (
    FLAG_PRODUCER,
    KIND_JSON,
    PRODUCER_TAIL,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
)
from stream_server.engine.batch import Tail
from stream_server.engine.log_reads import LogReads
from stream_server.engine.ops import DropHead, Op

log = logging.getLogger("stream_server.engine")


class HeadDrops:
    """The reads a drop needs (through the engine's ``LogReads``: its tails, its damaged
    streams, its segments), its index entries, and the blocks it gives back."""

    def __init__(self, reads: LogReads, hook: Callable[[str], None]) -> None:
        self.reads = reads
        self.hook = hook  # the fault hook's "punch" stage (``FailClosed.hook``)
        self.reclaimed_bytes = 0  # given back by punching so far (a metric)
        self.punch_failures = 0
        self._punched: dict[int, int] = {}  # stream id -> how far its file is punched

    def punch(self, sid: int, start_pos: int) -> bool:
        """Give back the blocks below a durable retained start; True when some went (the
        file's holes then need the next checkpoint's flush). A file system that cannot
        punch keeps them (counted, logged once): nothing is lost but space."""
        segments = self.reads.segments
        if sid in segments.inline:
            return False  # a few hundred bytes in LMDB: nothing to give back
        self.hook("punch")
        done = self._punched.get(sid, 0)
        try:
            upto, punched = segments.punch_below(sid, start_pos, done)
        except OSError as exc:
            self.punch_failures += 1
            if self.punch_failures == 1:
                log.warning("retention cannot give disk space back here: %s", exc)
            return False
        if upto <= done:
            return False
        self.reclaimed_bytes += punched
        self._punched[sid] = upto
        return True

    def forget(self, sid: int) -> None:
        """A dropped stream's file is gone: nothing of it is punched any more."""
        self._punched.pop(sid, None)

    def retention_point(  # noqa: C901 - the bounds of a retention cut, each beside the others
        self, sid: int, *, min_pos: int, cutoff_us: int | None, max_unit: int
    ) -> tuple[int, int] | None:
        """Where a drop may move the retained start: the first record that starts at
        or after file position ``min_pos`` and, with ``cutoff_us``, was committed at or
        after that time; never past unit ``max_unit`` (the tail the caller saw).
        Returns (unit, file position), or None when the start stays.

        Reads record headers only (never payloads), from the index entry at or
        below ``min_pos``, so the cost is the records dropped plus one granule.
        Runs on any thread; it looks at the committed log, which only grows.
        """
        reads = self.reads
        tail = reads.tails.get(sid)
        if tail is None or sid in reads.damaged:
            return None
        file_len, tail_unit = tail.file_len, tail.unit
        pos, unit = reads.index_floor(sid, None, max_pos=max(min_pos, tail.start_pos))
        if pos < tail.start_pos:
            pos, unit = tail.start_pos, tail.start
        max_unit = min(max_unit, tail_unit)
        unpack = RECORD_HEADER.unpack_from
        log = reads.segments.open_log(sid)
        try:
            while pos < file_len and unit < max_unit:
                buf = log.pread(min(256 * 1024, file_len - pos), pos)
                off = 0
                while off + RECORD_HEADER_SIZE <= len(buf):
                    _, plen, rkind, flags, pidlen, rstart, ts = unpack(buf, off)
                    if rstart != unit:  # not a record start: drop nothing rather than guess
                        return None
                    if pos + off >= min_pos and (cutoff_us is None or ts >= cutoff_us):
                        return self._point(tail, unit, pos + off)
                    size = RECORD_HEADER_SIZE + plen
                    if flags & FLAG_PRODUCER:
                        size += PRODUCER_TAIL.size + pidlen
                    nxt = unit + (1 if rkind == KIND_JSON else plen)
                    if nxt > max_unit:
                        return self._point(tail, unit, pos + off)
                    unit = nxt
                    off += size
                    if off > len(buf):  # the payload runs past the buffer: skip it
                        break
                if off == 0:
                    return None  # a header cut by the end of the log: cannot happen
                pos += off
        finally:
            log.close()
        return self._point(tail, unit, min(pos, file_len))

    def first_record_time(self, sid: int) -> tuple[int, int] | None:
        """(file position, commit time in µs) of the first retained record, or None when
        the stream holds none. One small read; runs on any thread."""
        tail = self.reads.tails.get(sid)
        if tail is None or tail.start >= tail.unit or sid in self.reads.damaged:
            return None
        pos = tail.start_pos
        head = self.reads.segments.read(sid, pos, RECORD_HEADER_SIZE)
        if len(head) < RECORD_HEADER_SIZE:
            return None
        return pos, RECORD_HEADER.unpack(head)[6]

    @staticmethod
    def _point(tail: Tail, unit: int, pos: int) -> tuple[int, int] | None:
        return (unit, pos) if unit > tail.start else None

    def resolve(self, ops: list[Op]) -> None:
        """Name the index entries each retention drop makes useless (those below its
        new start), so that they are deleted in the same batch."""
        drops = [op for op in ops if isinstance(op, DropHead)]
        if not drops:
            return
        meta = self.reads.meta
        with meta.env.begin() as txn:
            cur = txn.cursor(db=meta.dbs[DB_INDEX])
            for op in drops:
                tail = self.reads.tails.get(op.stream_id)
                if tail is None or op.unit <= tail.start:
                    continue
                stop = index_key(op.stream_id, op.unit)
                keys: list[bytes] = []
                if cur.set_range(index_key(op.stream_id, 0)):
                    for key in cur.iternext(values=False):
                        if key >= stop:
                            break
                        keys.append(bytes(key))
                op.index_keys = keys
