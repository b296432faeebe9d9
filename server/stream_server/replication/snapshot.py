"""Re-copy, first version: a consistent copy of the primary's data, installed by a
standby that cannot follow by frames (a wiped or long-gone replica, or a former
primary whose unacknowledged tail diverged from the new history).

The primary's copy is a tar of: the version file, the set id file (so the copy
belongs to the primary's set, docs/replication.md "A set's identity"), an LMDB
copy (one read transaction, so one batch boundary: its ``replica_position`` says
which), and each stream's segment file up to the tail that copy records. Bytes below a
committed tail never change, except that retention may punch them; a copy
during which a retained start moved is taken again. The WAL is not copied:
everything it holds is in LMDB and the segment files already.

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
import sys
import tarfile
import tempfile
from pathlib import Path

from stream_format.layout import Layout
from stream_format.meta import DB_TAILS, decode_tail, key_stream_id
from stream_server.engine import fsio
from stream_server.engine.engine import Engine
from stream_server.engine.metadata import Metadata

ATTEMPTS = 5


def build(engine: Engine, out: Path) -> None:
    """Write the tar to ``out``. Runs on a worker thread, beside the writer."""
    for _ in range(ATTEMPTS):
        if _build_once(engine, out):
            return
    raise RuntimeError("retention kept moving while the copy was taken; try again")


def _build_once(engine: Engine, out: Path) -> bool:
    layout = engine.layout
    with tempfile.TemporaryDirectory(dir=layout.root, prefix=".snapshot-") as tmp:
        meta_copy = Path(tmp) / "meta"
        meta_copy.mkdir()
        assert engine.meta is not None
        engine.meta.env.copy(str(meta_copy))
        copy = Metadata(meta_copy, engine.map_size)
        try:
            with copy.env.begin() as txn:
                tails = {
                    key_stream_id(k): decode_tail(bytes(v))
                    for k, v in txn.cursor(db=copy.dbs[DB_TAILS])
                }
        finally:
            copy.env.close()
        with tarfile.open(out, "w") as tar:
            tar.add(layout.version_file, arcname=layout.version_file.name)
            if layout.set_id_file.exists():  # a primary from before set ids has none yet
                tar.add(layout.set_id_file, arcname=layout.set_id_file.name)
            tar.add(meta_copy, arcname="meta")
            for sid, tail in tails.items():
                path = engine.segments.path(sid)
                try:
                    fd = fsio.open_read(path)
                except FileNotFoundError:
                    return False  # deleted meanwhile: take the copy again
                try:
                    info = tarfile.TarInfo(str(path.relative_to(layout.root)))
                    info.size = tail.file_len
                    with os.fdopen(os.dup(fd), "rb") as f:
                        tar.addfile(info, _Limited(f, tail.file_len))
                finally:
                    fsio.close(fd)
        for sid, tail in tails.items():
            now = engine.tails.get(sid)
            if now is not None and now.start_pos != tail.start_pos:
                return False  # punched while copied: the copy may hold zeros it needs
    return True


class _Limited:
    """A file's first ``size`` bytes, as tarfile reads them."""

    def __init__(self, f: object, size: int) -> None:
        self.f = f
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data: bytes = self.f.read(n)  # type: ignore[attr-defined]
        self.left -= len(data)
        return data


def extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract a primary's copy into ``dest``: plain files and directories inside it only.

    Python's ``data`` extraction filter does it where Python has one (3.11.4 and later);
    the server image's Python (Debian bookworm's 3.11.2) has none, and there the same
    rules are checked here before anything is written: a member that is not a regular
    file or directory, or whose path leaves ``dest``, refuses the whole copy. Modes and
    owners in the archive are not applied either way (the files are this process's).
    """
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = dest.resolve()
    members = tar.getmembers()
    for member in members:
        inside = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not inside.is_relative_to(root):
            raise tarfile.TarError(f"a copy holds {member.name!r}: not a file inside it")
    for member in members:
        tar.extract(member, dest, set_attrs=False)


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


def restart_process() -> None:
    """Exec this process again with the command line it was started with."""
    os.execv(sys.executable, sys.orig_argv)
