"""The WAL frames the archive lacks, read from the local files that still hold them.

Frames above the archived lsn are in the spool (``<data-dir>/archive/``, WAL files
a checkpoint moved there) and then in ``wal/`` (the files the engine writes);
both keep the WAL's file names, whose numbers give the order. A file can move
from ``wal/`` to the spool between two listings: ``wal/`` is listed first, so a
moving file is seen in one or both, and it is opened wherever it is when read.

Only frames at or below the engine's published lsn are read: a frame above it
may still be taken back (a single node truncates a frame whose LMDB commit
failed) or be torn. Each frame is stamped with the time it was first read:
within the archiver's wake-up of its commit while the server runs (it is woken
per batch), the time of the read after a restart; a restore to a time may
therefore stop a moment before a frame's real commit, never after it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from stream_format import wal as walmod
from stream_format.archive import ArchivedFrame
from stream_format.layout import Layout
from stream_format.wal import FRAME_HEADER, FRAME_MAGIC
from stream_server.engine.wal_keep import spool_dir

READ_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Read:
    """A frame with where it ends: the file and the position just past it."""

    frame: ArchivedFrame
    number: int
    end: int


@dataclass
class WalSource:
    """Reads frames with lsns above ``after`` in order; call ``read`` repeatedly."""

    layout: Layout
    after: int  # the last lsn read (or archived, at the start)
    number: int = 0  # the file being read
    offset: int = 0  # where in it (0: at its start)
    # Last lsn of each file read to its end (0: it held none above ``after``); the
    # spooled ones are deleted once the archive holds that lsn.
    finished: dict[int, int] = field(default_factory=dict)
    # (file, position) just past the last frame skipped as archived already.
    passed: tuple[int, int] = (0, 0)
    _last_in_file: int = 0

    def files(self) -> list[tuple[int, Path]]:
        """(number, path) of every local WAL file, oldest first, ``wal/`` listed first."""
        seen: dict[int, Path] = {}
        for path in walmod.wal_files(self.layout.wal):
            seen[walmod.file_number(path)] = path
        spool = spool_dir(self.layout)
        if spool.is_dir():
            for path in walmod.wal_files(spool):
                seen[walmod.file_number(path)] = path
        return sorted(seen.items())

    def read(self, upto: int, max_bytes: int) -> list[Read]:
        """Frames after ``after`` up to lsn ``upto``, about ``max_bytes`` of them."""
        out: list[Read] = []
        for number, path in self.files():
            if number < self.number:
                continue
            if number > self.number:
                if self.number:
                    self.finished[self.number] = self._last_in_file
                self.number, self.offset, self._last_in_file = number, 0, 0
            if not self._read_file(path, upto, max_bytes, out):
                return out  # stopped inside this file: the rest is not published yet
        return out

    def _read_file(self, path: Path, upto: int, max_bytes: int, out: list[Read]) -> bool:
        """Frames of one file into ``out``; True when it was read to its end."""
        chunk = max(max_bytes, READ_CHUNK)
        while True:
            base = self.offset or walmod.HEADER_SIZE
            data = _read_from(self.layout, path, base, chunk)
            if data is None:
                return True  # gone: a checkpoint deleted it, so the archive holds it
            off, need = self._frames(data, base, path, upto, out)
            self.offset = base + off
            if need and len(data) == chunk:
                chunk = max(chunk, need)  # a frame longer than the chunk: read it whole
                continue
            if len(data) < chunk or off == 0:
                return off == len(data)
            if sum(len(r.frame.frame) for r in out) >= max_bytes:
                return False

    def _frames(
        self, data: bytes, base: int, path: Path, upto: int, out: list[Read]
    ) -> tuple[int, int]:
        """(bytes of ``data`` consumed, bytes the next frame needs when ``data`` ends
        inside it, else 0)."""
        number = walmod.file_number(path)
        off = 0
        while off + FRAME_HEADER.size <= len(data):
            magic, length, _crc, lsn = FRAME_HEADER.unpack_from(data, off)
            end = off + FRAME_HEADER.size + length
            if magic != FRAME_MAGIC or lsn > upto:
                return off, 0
            if end > len(data):
                return off, end - off
            if lsn > self.after:
                frame = ArchivedFrame(lsn, time.time_ns() // 1000, bytes(data[off:end]))
                out.append(Read(frame, number, base + end))
                self.after = lsn
            else:
                self.passed = (number, base + end)
            self._last_in_file = max(self._last_in_file, lsn)
            off = end
        return off, 0


def _read_from(layout: Layout, path: Path, offset: int, max_bytes: int) -> bytes | None:
    """Up to ``max_bytes`` of a WAL file from ``offset``, wherever it
    is now (``wal/`` or the spool); None when it is in neither."""
    for candidate in (path, layout.wal / path.name, spool_dir(layout) / path.name):
        try:
            fd = os.open(candidate, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            return os.pread(fd, max_bytes, offset)
        finally:
            os.close(fd)
    return None
