"""Where each stream's log lives: its segment file, or (while it is small) LMDB.

A stream's log is the bytes of its segment file: a file header, then records.
Since format 5, a new stream's log is kept *inline*, as one value of LMDB's
``inline`` database, until a batch takes it past ``INLINE_MAX`` bytes; that
batch moves it into its own file, and its WAL frame carries the whole log (a
write at position 0), so replaying the frame alone rebuilds the file. So a
million streams of one small record cost a few hundred bytes of LMDB each, not
a file, an inode and a 4 KiB block each, and a checkpoint flushes only the files
of streams that grew. Files never go back inline; a directory of an older
format keeps its files.

Where a batch's bytes go is decided once, on the writer, before its frame is
made (``place``): inline logs travel in the frame as whole LMDB values, so a
standby, recovery and a restore apply them as any other metadata. ``inline``
(the streams kept inline) follows the frames' ``inline`` changes at publish.

Write descriptors are cached (a bounded LRU: a server with many active streams
must not run out of descriptors); reads open, read and close, so that any
thread may read.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from types import TracebackType

from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_format.meta import DB_INLINE, id_key, key_stream_id
from stream_format.records import FILE_HEADER_SIZE, check_file_header
from stream_server.engine import fsio
from stream_server.engine.metadata import Metadata

WRITER_FDS = 256
# The longest log kept inline (file header included): a quarter of an LMDB page, so
# that several share a leaf page; each append rewrites the whole value (and the WAL
# frame carries it whole), so short keeps that cheap. Above it a file costs at most
# a quarter of its bytes in slack.
INLINE_MAX = 1024


class LogReader:
    """A stream's log open for positional reads: its file, or a copy of its inline
    value (taken in one read transaction, so it holds at least the published tail)."""

    __slots__ = ("_data", "_fd")

    def __init__(self, fd: int = -1, data: bytes | None = None) -> None:
        self._fd = fd
        self._data = data

    def pread(self, size: int, pos: int) -> bytes:
        if self._data is not None:
            return self._data[pos : pos + size]
        return fsio.pread(self._fd, size, pos)

    def close(self) -> None:
        if self._fd >= 0:
            fsio.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LogReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def inline_changes(changes: list[walmod.Entry]) -> tuple[set[int], set[int]]:
    """The streams a batch's (or frames') metadata puts inline and those it takes out
    (moved to a file, or dropped)."""
    put: set[int] = set()
    gone: set[int] = set()
    for entry in changes:
        if entry[1] == DB_INLINE:
            sid = key_stream_id(entry[2])
            if entry[0] == walmod.PUT:
                put.add(sid)
                gone.discard(sid)
            else:
                gone.add(sid)
                put.discard(sid)
    return put, gone


class Segments:
    def __init__(self, layout: Layout, inline_max: int = INLINE_MAX) -> None:
        self.layout = layout
        self.inline_max = inline_max  # 0: every log in a file (as formats 1 to 4 kept them)
        self._fds: OrderedDict[int, int] = OrderedDict()
        self.checked: set[int] = set()  # stream ids whose file header was seen to be right
        self.meta: Metadata | None = None  # set once the engine has opened LMDB
        self.inline: set[int] = set()  # the streams whose log is in LMDB, as published

    def load_inline(self) -> None:
        """The streams kept inline, from LMDB (at open, after recovery)."""
        assert self.meta is not None
        with self.meta.env.begin() as txn:
            cur = txn.cursor(db=self.meta.dbs[DB_INLINE])
            self.inline = {key_stream_id(k) for k in cur.iternext(values=False)}

    def inline_value(self, sid: int) -> bytes | None:
        """The stream's inline log as committed, or None (it has a file)."""
        assert self.meta is not None
        with self.meta.env.begin() as txn:
            raw = txn.get(id_key(sid), db=self.meta.dbs[DB_INLINE])
            return None if raw is None else bytes(raw)

    def open_log(self, sid: int) -> LogReader:
        """The stream's log for reading. One published as inline but moved to its file
        meanwhile (the move's commit came between the check and the read) has its
        file already: the file is written before the commit that empties the value."""
        if sid in self.inline:
            data = self.inline_value(sid)
            if data is not None:
                return LogReader(data=data)
        return LogReader(fd=fsio.open_read(self.path(sid)))

    def place(self, writes: dict[int, tuple[int, bytes]], changes: list[walmod.Entry]) -> None:
        """Decide where a batch's bytes go, before its frame is made: a new stream's
        log (written from position 0) and an inline one that stays within
        ``inline_max`` become whole ``inline`` values in ``changes`` (and leave
        ``writes``); an inline log that grows past it becomes one write of the whole
        log at position 0, and its value is deleted. Runs on the writer thread."""
        inline = self.inline
        if not any(sid in inline or pos == 0 for sid, (pos, _) in writes.items()):
            return  # files' logs only: no LMDB read for the common append
        assert self.meta is not None
        db = self.meta.dbs[DB_INLINE]
        with self.meta.env.begin() as txn:
            for sid, (pos, data) in list(writes.items()):
                if sid in self.inline:
                    raw = txn.get(id_key(sid), db=db)
                    data = (bytes(raw[:pos]) if raw is not None else b"") + data
                elif pos != 0:
                    continue  # a file's log
                if len(data) <= self.inline_max:
                    changes.append((walmod.PUT, DB_INLINE, id_key(sid), data))
                    del writes[sid]
                elif sid in self.inline:
                    writes[sid] = (0, data)
                    changes.append((walmod.DELETE, DB_INLINE, id_key(sid)))

    def path(self, sid: int) -> Path:
        return self.layout.segment_path(sid)

    def writer(self, sid: int) -> int:
        """A write descriptor for the stream's file, created (with its directory) if new."""
        fd = self._fds.get(sid)
        if fd is not None:
            self._fds.move_to_end(sid)
            return fd
        path = self.path(sid)
        try:
            fd = fsio.open_write(path)
        except FileNotFoundError:
            fsio.mkdir(path.parent)
            fsio.fsync_dir(path.parent.parent)
            fd = fsio.open_write(path)
        self._fds[sid] = fd
        if len(self._fds) > WRITER_FDS:
            _, old = self._fds.popitem(last=False)
            fsio.close(old)
        return fd

    def close(self, sid: int) -> None:
        fd = self._fds.pop(sid, None)
        if fd is not None:
            fsio.close(fd)

    def close_all(self) -> None:
        for fd in self._fds.values():
            fsio.close(fd)
        self._fds.clear()

    def read(self, sid: int, pos: int, size: int) -> bytes:
        with self.open_log(sid) as log:
            return log.pread(size, pos)

    def punch_below(self, sid: int, start_pos: int, done: int = 0) -> tuple[int, int]:
        """Give back the file system blocks wholly below ``start_pos`` (the retained
        start), from file position ``done`` on (where an earlier call stopped; 0: from
        the start); returns where this one stopped (a block boundary, for the next)
        and how many bytes it punched.

        The first block holds the file header and stays; so does the block the
        retained start shares with dropped bytes. Punching is idempotent, so
        recovery simply does it again for every stream whose head was dropped.
        """
        fd = self.writer(sid)
        block = os.fstat(fd).st_blksize or 4096
        lo = max(-(-FILE_HEADER_SIZE // block) * block, done)
        hi = start_pos // block * block
        if hi <= lo:
            return max(done, lo), 0
        fsio.punch_hole(fd, lo, hi - lo)
        return hi, hi - lo

    def check_header(self, sid: int) -> None:
        """CorruptRecord unless the file starts with the magic and its own stream id."""
        check_file_header(self.read(sid, 0, FILE_HEADER_SIZE), sid)
        self.checked.add(sid)
