"""Recovery: from whatever a crash left to a directory whose every part agrees.

1. Replay the WAL: every frame since the last checkpoint is redone (data as
   positional writes into segment files, metadata as whole LMDB values), which
   is idempotent; what it redid is flushed, directories included, before the
   WAL may go. A WAL file that is not one this program replays (wrong magic,
   newer version, a bad frame before the end) stops recovery with its name:
   skipping it could lose acknowledged writes.
2. Load the committed state from LMDB.
3. Make each segment file end exactly at its committed tail (a log kept
   inline in LMDB, format 5, is committed with its tail: nothing to do): bytes past it
   belong to no acknowledged write and are cut; a file shorter than its tail
   lost data to something outside our control and is recovered to its last
   whole record, loudly. Files touched by 1 or 3 have their header and last
   records checked; a stream that fails is damaged, never served. Below
   each retained start (format 4), the file is punched again: a drop that
   committed before the crash may not have given its blocks back yet.
4. Remove the files of streams whose deletion committed before the crash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from stream_format import index
from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_format.meta import (
    DB_INDEX,
    DB_INFO,
    DB_INLINE,
    DB_STREAMS,
    DB_TAILS,
    KEY_NEXT_STREAM_ID,
    U64,
    decode_tail,
    encode_tail,
    id_key,
    index_key,
    key_stream_id,
    stream_path,
)
from stream_format.records import FILE_HEADER_SIZE, CorruptRecord, iter_records
from stream_server.engine import fsio
from stream_server.engine.batch import Tail
from stream_server.engine.metadata import Metadata, delete_prefix
from stream_server.engine.segments import Segments

log = logging.getLogger("stream_server.engine")


@dataclass(slots=True)
class LoadedState:
    """What a start needs at once: every tail (the engine serves reads by stream id),
    the id counter, how many streams there are, and the paths of those with a TTL or
    an Expires-At (the sweeper's). A stream's configuration and producers are loaded
    when it is first asked for (``LogReads.stored_stream``): a start costs its tails,
    not a Python object per stream."""

    streams: int
    tails: dict[int, Tail]
    next_stream_id: int
    timed: list[str]


@dataclass(slots=True)
class RecoveryProgress:
    """How far a running recovery is, read by the server while it answers probes.

    Written by the recovery thread, read from the event loop: plain ints and a
    string, each replaced whole, so a reader sees a value that was true a moment
    ago. ``streams_total`` is known once the metadata is loaded.
    """

    phase: str = "starting"  # starting, wal, loading, tails, orphans, done
    wal_frames: int = 0
    streams_total: int = 0
    streams_checked: int = 0


@dataclass(slots=True)
class RecoveryReport:
    seconds: float = 0.0
    streams: int = 0
    wal_frames_replayed: int = 0
    truncated_streams: int = 0
    truncated_bytes: int = 0
    damaged: dict[int, str] = field(default_factory=dict)
    orphan_files_removed: int = 0


def has_expiry(raw: bytes) -> bool:
    """Whether a stream's JSON sets a TTL or an Expires-At, without decoding it (a start
    looks at every stream's): format 5 leaves out a null field, older ones spell it."""
    return (b'"ttl":' in raw and b'"ttl":null' not in raw) or (
        b'"expires_at_ts":' in raw and b'"expires_at_ts":null' not in raw
    )


class Recovery:
    def __init__(
        self,
        layout: Layout,
        meta: Metadata,
        segments: Segments,
        write_meta: Callable[[list[walmod.Entry]], None],
        *,
        headerless_wal: bool = False,
        progress: RecoveryProgress | None = None,
        replayed: Callable[[int, list[walmod.Entry], memoryview], None] | None = None,
    ) -> None:
        self.layout = layout
        self.progress = progress or RecoveryProgress()
        self.headerless_wal = headerless_wal  # a format-1 directory's WAL files
        self.meta = meta
        self.segments = segments
        self.write_meta = write_meta
        # Told of each frame replayed (lsn, metadata changes, the frame's bytes): a
        # replica set's hooks keep them for shipping (engine/replica.py).
        self.replayed = replayed
        self.damaged: dict[int, str] = {}
        self.lsn = 0  # the last frame replayed

    def run(self) -> tuple[LoadedState, RecoveryReport]:
        report = RecoveryReport()
        progress = self.progress
        progress.phase = "wal"
        touched = self._replay_wal(report)
        progress.phase = "loading"
        self.segments.load_inline()
        state = self._load()
        progress.streams_total = len(state.tails)
        progress.phase = "tails"
        self._check_tails(state, touched, report)
        self._punch_dropped(state)
        progress.phase = "orphans"
        self._remove_orphans(state, report)
        self.meta.sync()
        progress.phase = "done"
        report.streams = state.streams
        report.damaged = dict(self.damaged)
        return state, report

    def _replay_wal(self, report: RecoveryReport) -> set[int]:
        files = walmod.wal_files(self.layout.wal)
        touched: set[int] = set()
        for i, path in enumerate(files):
            last = i == len(files) - 1
            for frame in walmod.read_frames(path, last_file=last, headerless=self.headerless_wal):
                changes = []
                for entry in frame.entries:
                    if entry[0] == walmod.WRITE:
                        _, sid, pos, data = entry
                        fsio.pwrite(self.segments.writer(sid), data, pos)
                        touched.add(sid)
                    else:
                        changes.append(entry)
                self.write_meta(changes)
                if self.replayed is not None:
                    self.replayed(frame.lsn, changes, frame.raw)
                self.lsn = max(self.lsn, frame.lsn)
                report.wal_frames_replayed += 1
                self.progress.wal_frames = report.wal_frames_replayed
        # The WAL is deleted once recovery ends: what it redid must be durable first,
        # the files' directory entries included (replay may have created them).
        fsio.fdatasync_paths([self.segments.path(sid) for sid in touched], fsio.FLUSH_WORKERS)
        for sub in {self.segments.path(sid).parent for sid in touched}:
            fsio.fsync_dir(sub)
        return touched

    def _load(self) -> LoadedState:
        tails: dict[int, Tail] = {}
        timed: list[str] = []
        streams = 0
        next_id = 1
        dbs = self.meta.dbs
        with self.meta.env.begin() as txn:
            raw = txn.get(KEY_NEXT_STREAM_ID, db=dbs[DB_INFO])
            if raw:
                next_id = U64.unpack(raw)[0]
            for key, value in txn.cursor(db=dbs[DB_STREAMS]):
                streams += 1
                if has_expiry(value):
                    timed.append(stream_path(key))
            for key, value in txn.cursor(db=dbs[DB_TAILS]):
                tails[key_stream_id(key)] = Tail(*decode_tail(value))
        return LoadedState(streams, tails, next_id, timed)

    def _check_tails(self, state: LoadedState, touched: set[int], report: RecoveryReport) -> None:
        inline = self.segments.inline  # committed with their tails: nothing to check
        for checked, (sid, tail) in enumerate(list(state.tails.items()), 1):
            self.progress.streams_checked = checked
            if sid in inline:
                continue
            path = self.segments.path(sid)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                self.damaged[sid] = f"segment file {path} is missing"
                continue
            if size > tail.file_len:
                fsio.truncate(path, tail.file_len)
                report.truncated_streams += 1
                report.truncated_bytes += size - tail.file_len
                touched.add(sid)
            elif size < tail.file_len:
                state.tails[sid] = self._recover_short_file(sid, size, tail, report)
                continue
            if sid in touched:
                try:
                    self._verify_tail_records(sid, tail)
                except CorruptRecord as exc:
                    self.damaged[sid] = str(exc)

    def _floor(self, tail: Tail, sid: int, max_pos: int) -> tuple[int, int]:
        with self.meta.env.begin() as txn:
            return index.floor(
                txn,
                self.meta.dbs[DB_INDEX],
                sid,
                None,
                tail.base,
                max_pos=max_pos,
                first=(tail.start_pos, tail.start),
            )

    def _punch_dropped(self, state: LoadedState) -> None:
        """Punch again below every retained start: the drop committed before a crash
        may not have punched (or the WAL replay above wrote dropped records back).
        Idempotent, one call per trimmed stream, and not flushed: a punch lost to a
        power cut is done again by the next recovery."""
        for sid, tail in state.tails.items():
            if (
                tail.start_pos > FILE_HEADER_SIZE
                and sid not in self.damaged
                and sid not in self.segments.inline
            ):
                try:
                    self.segments.punch_below(sid, tail.start_pos)
                except OSError as exc:
                    log.warning("stream id %d: cannot punch below its retained start: %s", sid, exc)

    def _recover_short_file(self, sid: int, size: int, tail: Tail, report: RecoveryReport) -> Tail:
        start_pos, start_unit = self._floor(tail, sid, size)
        good_pos, good_unit = start_pos, start_unit
        data = self.segments.read(sid, start_pos, size - start_pos)
        try:
            for rec in iter_records(data, start_pos):
                good_pos, good_unit = rec.end, rec.stop
        except CorruptRecord:
            pass
        fsio.truncate(self.segments.path(sid), good_pos)
        log.error(
            "stream id %d: segment file is %d bytes short of its committed tail; "
            "recovered to the last whole record (unit %d, %d units lost)",
            sid,
            tail.file_len - size,
            good_unit,
            tail.unit - good_unit,
        )
        new_tail = Tail(good_pos, good_unit, tail.base, tail.start, tail.start_pos)
        if good_pos < tail.start_pos:  # lost even the retained start: keep nothing
            new_tail.start, new_tail.start_pos = good_unit, good_pos
        with self.meta.write() as txn:
            txn.put(id_key(sid), encode_tail(new_tail.value()), db=self.meta.dbs[DB_TAILS])
            # Index entries past the recovered tail point at bytes that are gone.
            delete_prefix(
                txn, self.meta.dbs[DB_INDEX], id_key(sid), start=index_key(sid, good_unit + 1)
            )
        report.truncated_streams += 1
        report.truncated_bytes += tail.file_len - good_pos
        return new_tail

    def _verify_tail_records(self, sid: int, tail: Tail) -> None:
        self.segments.check_header(sid)
        pos, _ = self._floor(tail, sid, tail.file_len)
        end = pos
        for rec in iter_records(self.segments.read(sid, pos, tail.file_len - pos), pos):
            end = rec.end
        if end != tail.file_len:
            raise CorruptRecord(f"stream id {sid}: records end at {end}, tail is {tail.file_len}")

    def _remove_orphans(self, state: LoadedState, report: RecoveryReport) -> None:
        """Delete segment files (and inline logs) of streams whose deletion committed
        before a crash."""
        stale = self.segments.inline - state.tails.keys()
        if stale:
            with self.meta.write() as txn:
                for sid in stale:
                    txn.delete(id_key(sid), db=self.meta.dbs[DB_INLINE])
            self.segments.inline -= stale
            report.orphan_files_removed += len(stale)
        for sub in self.layout.segments.iterdir():
            if not sub.is_dir():
                continue
            for path in sub.iterdir():
                try:
                    sid = int(path.stem, 16)
                except ValueError:
                    continue
                if sid not in state.tails:
                    self.segments.close(sid)
                    fsio.unlink(path)
                    report.orphan_files_removed += 1
