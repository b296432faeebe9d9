"""The segment files as the engine uses them: paths, write descriptors, header checks.

Write descriptors are cached (a bounded LRU: a server with many active streams
must not run out of descriptors); reads open, read and close, so that any
thread may read.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from stream_format.layout import Layout
from stream_format.records import FILE_HEADER_SIZE, check_file_header
from stream_server.engine import fsio

WRITER_FDS = 256


class Segments:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._fds: OrderedDict[int, int] = OrderedDict()
        self.checked: set[int] = set()  # stream ids whose file header was seen to be right

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
        fd = fsio.open_read(self.path(sid))
        try:
            return fsio.pread(fd, size, pos)
        finally:
            fsio.close(fd)

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
