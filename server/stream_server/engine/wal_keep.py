"""WAL the object-store archive still needs: kept in ``<data-dir>/archive/``.

Without an archive a checkpoint deletes the WAL files it covered, and a start
deletes the files recovery replayed. With one, a file that holds a frame above
the archived lsn (``archive_floor``, the archiver's answer) is *moved* into the
spool directory instead: a hard link in the spool, the spool flushed, then the
name in ``wal/`` removed and ``wal/`` flushed. A crash leaves the file under one
name or both, never neither (a rename across two directories is not atomic
under a power cut on every file system: the crash-state explorer cuts each
directory's entries on its own); one in both is replayed and moved again. The
archiver deletes it once the archive holds its last frame. Recovery never
replays the spool: its frames are in LMDB and the segment files already (the
checkpoint that moved them flushed those first). A start without an archive
removes the spool.

A single node numbers its frames from its last replayed frame, which a clean
shutdown (an empty WAL) resets; the archive needs lsns that never repeat. So a
single node with an archive writes its lsn into each batch's metadata
(``KEY_LSN``, in the frame and in LMDB in one commit, as a replica set's
position is) and continues from it at the next start. Nothing of this runs
without an archive: the engine's hook is None there.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from pathlib import Path

from stream_format import wal as walmod
from stream_format.layout import Layout
from stream_format.meta import DB_INFO
from stream_server.engine import fsio
from stream_server.engine.metadata import Metadata

SPOOL_DIR = "archive"  # below the data directory
KEY_LSN = b"archive_lsn"  # DB_INFO: the lsn of a single node's last batch, "<Q"
_LSN = struct.Struct("<Q")

# The archived lsn: frames at or below it are in the archive, those above are kept.
ArchiveFloor = Callable[[], int]


def spool_dir(layout: Layout) -> Path:
    return layout.root / SPOOL_DIR


def spooled_files(layout: Layout) -> list[Path]:
    """The spooled WAL files, oldest first (their names are the WAL's numbers)."""
    spool = spool_dir(layout)
    return walmod.wal_files(spool) if spool.is_dir() else []


def retire(layout: Layout, paths: list[Path], keep: bool) -> None:
    """Delete WAL files recovery or a checkpoint is done with, or (``keep``: the
    archive still needs a frame of theirs) move them into the spool (above). Flushes
    the directories it changed, the spool first."""
    if not paths:
        return
    if keep:
        spool = make_spool(layout)
        for path in paths:
            with contextlib.suppress(FileExistsError):  # linked before a crash: the same file
                fsio.link(path, spool / path.name)
        fsio.fsync_dir(spool)
    for path in paths:
        fsio.unlink(path)
    fsio.fsync_dir(layout.wal)


def make_spool(layout: Layout) -> Path:
    """The spool directory, made durable (its entry in the data directory flushed)
    before any file is moved into it: a file renamed into a directory a crash then
    forgets is lost from both."""
    spool = spool_dir(layout)
    if not spool.is_dir():
        fsio.mkdir(spool)
        fsio.fsync_dir(layout.root)
    return spool


def remove_spool(layout: Layout) -> None:
    """A start without an archive: what was kept for one is of no use any more."""
    spool = spool_dir(layout)
    if not spool.is_dir():
        return
    for path in spool.iterdir():
        fsio.unlink(path)
    spool.rmdir()
    fsio.fsync_dir(layout.root)


def next_file_number(layout: Layout) -> int:
    """One past the highest WAL file number in the WAL or the spool: a new file never
    takes a spooled file's name."""
    files = walmod.wal_files(layout.wal) + spooled_files(layout)
    return max((walmod.file_number(p) for p in files), default=0) + 1


def stamp(changes: list[walmod.Entry], lsn: int) -> None:
    changes.append((walmod.PUT, DB_INFO, KEY_LSN, _LSN.pack(lsn)))


def stored_lsn(meta: Metadata) -> int:
    with meta.env.begin() as txn:
        raw = txn.get(KEY_LSN, db=meta.dbs[DB_INFO])
    return 0 if raw is None else int(_LSN.unpack(bytes(raw))[0])
