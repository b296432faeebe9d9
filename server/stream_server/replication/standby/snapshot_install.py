"""Re-copy, first version: a consistent copy of the primary's data, installed by a
standby that cannot follow by frames (a wiped or long-gone replica, or a former
primary whose unacknowledged tail diverged from the new history).

The primary's copy is the tar ``engine/snapshot.py`` builds (the version file, the
set id file, an LMDB copy whose ``replica_position`` says which batch it ends at,
and each stream's segment file up to the tail that copy records); base backups
upload the same tar (``archive/backup/base_backup.py``).

The standby stops its store, replaces its data directory's contents with the
copy (extracted beside them first, then swapped in by renames), and execs
itself again with the same command line: the new process recovers from the
copy and follows from its position. It is a standby throughout, so no client
write is lost by the restart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
from pathlib import Path

from stream_format.layout import Layout
from stream_server.engine import fsio
from stream_server.engine.snapshot import extract


def install(data_dir: Path, tar_path: Path) -> None:
    """Replace the data directory's contents with the copy in ``tar_path``.

    Extracted into a new directory beside the old contents first; the swap is a
    few renames. The store must be stopped. The copy's set id replaces ours; a copy
    without one (a primary from before set ids) leaves ours.
    """
    layout = Layout(data_dir)
    fresh = data_dir / ".recopy"
    shutil.rmtree(fresh, ignore_errors=True)
    with tarfile.open(tar_path) as tar:
        extract(tar, fresh)
    (fresh / "wal").mkdir(exist_ok=True)
    (fresh / "segments").mkdir(exist_ok=True)
    _sync_tree(fresh)
    old = data_dir / ".replaced"
    shutil.rmtree(old, ignore_errors=True)
    old.mkdir()
    parts = [layout.meta, layout.wal, layout.segments, layout.version_file]
    if (fresh / layout.set_id_file.name).exists():
        parts.append(layout.set_id_file)
    for part in parts:
        if part.exists():
            part.rename(old / part.name)
    for part in fresh.iterdir():
        part.rename(data_dir / part.name)
    fsio.fsync_dir(data_dir)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(fresh, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        tar_path.unlink()


def _sync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fsio.fdatasync_path(Path(dirpath) / name)
        fsio.fsync_dir(Path(dirpath))
