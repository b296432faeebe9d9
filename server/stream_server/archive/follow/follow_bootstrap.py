"""A replica cluster's first start: an empty data directory is built from the newest
base backup in the archive it follows, before the engine opens it.

``restore_newest`` is the one place that restores, with the restore command's own
code (``archive/backup/restore.py``: every part and file checked, the frames after the
backup replayed by the engine's recovery). An archive with no backup yet is
followed from lsn 1 (a young one: no retention has pruned its first frames).

What was restored is handed to the follower with the terms its frames were taken
along (``Restored``): the follower compares that record with the source's history
before each batch it applies, so it must start at lsn 1, not at the first frame the
follower applies itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from stream_format.archive import History
from stream_format.layout import Layout
from stream_server.archive.backup import catalog
from stream_server.archive.backup.restore import Target, restore
from stream_server.archive.follow.follow_plan import restored_history
from stream_server.archive.object_store import ObjectStore

log = logging.getLogger("stream_server.archive")


@dataclass(frozen=True)
class Restored:
    """What a first start restored: frames up to ``lsn``, taken along ``history``."""

    lsn: int
    history: History


def is_empty(data_dir: Path) -> bool:
    """Nothing in the directory but what a first start makes before the app runs (the
    version file and the empty meta/, wal/ and segments/ of ``engine.data_dir.prepare``,
    which ``serve`` runs first): a replica cluster's first start."""
    if not data_dir.exists():
        return True
    layout = Layout(data_dir)
    skeleton = {layout.version_file.name, layout.meta.name, layout.wal.name, layout.segments.name}
    for entry in data_dir.iterdir():
        if entry.name.startswith("."):  # as prepare() ignores them
            continue
        if entry.name not in skeleton:
            return False
        if entry.is_dir() and any(entry.iterdir()):
            return False
    return True


def restore_newest(store: ObjectStore, data_dir: Path) -> Restored | None:
    """Build ``data_dir`` from the newest complete base backup and the frames archived
    after it; what it then holds, or None when nothing was restored (the follower then
    applies frames from lsn 1)."""
    if not catalog.manifests(store):
        return None
    _remove_skeleton(data_dir)  # the restore builds into an empty directory only
    done = restore(store, data_dir, Target())
    # Read after the restore: no older than the history it followed (restored_history).
    history = restored_history(catalog.newest_history(store), int(done["term"]))
    return Restored(int(done["lsn"]), history)


def _remove_skeleton(data_dir: Path) -> None:
    """Remove what ``is_empty`` allows (empty directories and the version file)."""
    if not data_dir.exists():
        return
    for entry in data_dir.iterdir():
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            entry.rmdir()
        else:
            entry.unlink()


def bootstrap(store: ObjectStore, data_dir: Path) -> Restored | None:
    """Run on a blocking thread before recovery: restore when the directory is empty;
    what was restored (None: nothing)."""
    if not is_empty(data_dir):
        return None
    restored = restore_newest(store, data_dir)
    if restored is not None:
        log.info(
            "restored %s up to lsn %d (terms %s) into %s",
            store.url,
            restored.lsn,
            restored.history,
            data_dir,
        )
    else:
        log.info("no base backup restored: following %s from lsn 1", store.url)
    return restored
