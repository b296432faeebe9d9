"""The shared write-ahead log file: frames appended, one fsync per batch.

Every batch is written here first and flushed once, whatever the number of
streams it touches; only then are its records written to the per-stream
segment files (left to the page cache) and its metadata committed to LMDB.
Recovery replays the frames since the last checkpoint (``stream_format.wal``
decodes them), which is idempotent: data entries are positional writes and
metadata entries are whole values. A checkpoint flushes the segment files
and LMDB, then deletes old WAL files.

A new file gets its header (``stream_format.wal.encode_header``) flushed
before its first frame: a crash can leave a file whose header is missing or
incomplete only when no frame was ever written to it, which recovery reads as
empty.
"""

from __future__ import annotations

import time
from pathlib import Path

from stream_format.wal import FRAME_HEADER, HEADER_SIZE, encode_header
from stream_server.engine import fsio


class WalWriter:
    """Appends frames to the current WAL file; rotation starts a new file."""

    def __init__(self, wal_dir: Path, number: int) -> None:
        self.dir = wal_dir
        self.number = number
        self.path = wal_dir / f"{number:016d}.wal"
        self.fd = fsio.open_write(self.path, append=True)
        if fsio.size(self.fd):
            fsio.close(self.fd)
            raise FileExistsError(f"{self.path}: a WAL file is never reopened for writing")
        fsio.append(self.fd, encode_header(number))
        fsio.fdatasync(self.fd)
        self.size = HEADER_SIZE
        # The lsn of the file's first frame (0: none yet) and when it was appended: how
        # many frames recovery would replay, and for how long, decide a checkpoint.
        self.first_lsn = 0
        self.first_at = 0.0
        fsio.fsync_dir(wal_dir)

    def append(self, frame: bytes) -> None:
        """One frame, or several back to back (a primary's, on a standby)."""
        fsio.append(self.fd, frame)
        if not self.first_lsn:
            self.first_lsn = FRAME_HEADER.unpack_from(frame)[3]
            self.first_at = time.monotonic()
        self.size += len(frame)

    def sync(self) -> None:
        fsio.fdatasync(self.fd)

    def truncate_to(self, size: int) -> None:
        """Drop a frame whose write failed part-way (e.g. disk full)."""
        fsio.ftruncate(self.fd, size)
        self.size = size
        if size <= HEADER_SIZE:
            self.first_lsn = 0

    def rotate(self) -> WalWriter:
        self.close()
        return WalWriter(self.dir, self.number + 1)

    def close(self) -> None:
        if self.fd >= 0:
            fsio.close(self.fd)
            self.fd = -1
