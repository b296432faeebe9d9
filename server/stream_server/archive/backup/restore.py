"""Restore and point-in-time recovery: a data directory built from a base backup and the
archived frames after it, up to a target (the latest, an lsn, or a time).

Every step is checked before the next, and nothing reaches ``--data-dir`` until all
of them passed (docs/backup.md, "How restore checks"):

1. the backup: the one asked for, else the newest whose consistent point
   (``end_lsn``, ``time``) is at or before the target;
2. its parts, downloaded a few at a time, each of the size and CRC-32 the manifest
   gives; the tar read across them as a stream and extracted beside the target
   directory (plain files inside it only), every file of the size and CRC-32 the
   manifest gives, and no file it does not list (``backup_fetch.py``);
3. the frames after the backup's ``start_lsn``, along the newest term's history
   (``history_ranges``), every frames object checked whole (its CRC-32 and each
   frame's), lsn after lsn with no gap, written as one WAL file in the directory's
   ``wal/``; at least through the backup's ``end_lsn``, then up to the target (a time
   target stops at the first frame committed after it);
4. the engine's own recovery run on it (``Engine.open``, then ``close``: the WAL
   replayed, each stream's tail checked against its file, a final checkpoint);
5. the directory's identity made that of single-node data (below), and the whole
   directory renamed into ``--data-dir``, which must be empty or absent.

A failure at any step removes everything it made and names what failed (the object,
the lsns missing); ``--data-dir`` is left as it was.

The restored directory is single-node data that left the source's set: no
``SET_ID`` file, no ``replica_position`` or ``replica_terms``, and ``replica_left``
recording the source's set id and the (term, lsn) the restore stopped at (what
``engine.replica.leave_set`` writes when a single node starts on a member's
directory). So it starts as a single node as it is, and it may seed a new replica
set: single-node data creates a new Lease with a new set id
(docs/replication.md, "A set's identity"), and ``replica_left``'s term tells a
Lease created from it which term the source had reached.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from stream_format import wal as walmod
from stream_format.archive import decode_frames_object, history_ranges, parse_time, rfc3339
from stream_format.layout import LOCK_FILE, VERSION_FILE, Layout
from stream_format.meta import DB_INFO
from stream_server.archive import progress
from stream_server.archive.backup import backup_fetch, catalog
from stream_server.archive.object_store import ObjectStore
from stream_server.engine import dir_lock, fsio
from stream_server.engine.engine import Engine
from stream_server.engine.replica import KEY_LEFT, KEY_POSITION, KEY_TERMS

log = logging.getLogger("stream_server.archive")

NO_END = 2**63 - 1
WORK = ".restoring"  # inside an existing data directory: the restore's work
IGNORED = frozenset({"lost+found", WORK, LOCK_FILE})
WAL_NUMBER = 1


class RestoreFailed(Exception):
    """A restore that cannot be done as asked; the message names the backup, object or
    lsns at fault. Nothing was written to the target directory."""


@dataclass(frozen=True)
class Target:
    lsn: int | None = None
    time: float | None = None  # seconds since the epoch

    def describe(self) -> str:
        if self.lsn is not None:
            return f"lsn {self.lsn}"
        if self.time is not None:
            return rfc3339(self.time)
        return "the latest point"


@dataclass
class Reached:
    """Where the frames written so far end."""

    term: int
    lsn: int
    time_us: int | None = None
    frames: int = 0
    bytes: int = 0


def restore(
    store: ObjectStore, data_dir: Path, target: Target, backup_id: str | None = None
) -> dict[str, Any]:
    """Build ``data_dir`` from the archive; what was restored, as JSON."""
    started = time.monotonic()
    _must_be_empty(data_dir)
    manifest = choose(catalog.manifests(store), backup_id, target)
    # The directory's lock (made if it is missing) for the whole restore: no server
    # may start on it half-built, nor a second restore. The work is done inside it (it
    # may be a volume's mount point), on its file system, and moved into place there.
    made, locked = not data_dir.exists(), (data_dir / LOCK_FILE).exists()
    try:
        with dir_lock.holding(data_dir):
            downloaded, reached = _build(store, manifest, data_dir, target)
    except BaseException:
        if not locked:  # a refused restore leaves the directory as it found it
            _remove_lock(data_dir, made)
        raise
    seconds = time.monotonic() - started
    total = downloaded + reached.bytes
    return {
        "data_dir": str(data_dir),
        "backup": manifest["id"],
        "target": target.describe(),
        "term": reached.term,
        "lsn": reached.lsn,
        "time": None if reached.time_us is None else rfc3339(reached.time_us / 1e6),
        "frames": reached.frames,
        "bytes": total,
        "seconds": round(seconds, 3),
        "mib_per_second": round(total / 2**20 / seconds, 1) if seconds > 0 else None,
    }


def _build(
    store: ObjectStore, manifest: dict[str, Any], data_dir: Path, target: Target
) -> tuple[int, Reached]:
    """The restore under ``data_dir``'s lock: the bytes downloaded, where it reached."""
    _must_be_empty(data_dir)
    work = data_dir / WORK
    shutil.rmtree(work, ignore_errors=True)  # a restore that stopped half-way
    work.mkdir()
    try:
        root = work / "data"
        downloaded = fetch_backup(store, manifest, root)
        reached = write_frames(store, manifest, root, target)
        recover(root, manifest, reached)
        _must_be_empty(data_dir)
        _install(root, data_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return downloaded, reached


def _remove_lock(data_dir: Path, made: bool) -> None:
    """Remove the lock file the restore made (given back), and ``data_dir`` too if the
    restore ``made`` it and the lock file was all it held."""
    with contextlib.suppress(OSError):
        (data_dir / LOCK_FILE).unlink()
        if made:
            data_dir.rmdir()


def _must_be_empty(data_dir: Path) -> None:
    """Absent, or empty but for a file system's ``lost+found`` (a new volume) and the
    work directory of a restore that stopped half-way."""
    if not data_dir.exists():
        return
    if not data_dir.is_dir() or any(p.name not in IGNORED for p in data_dir.iterdir()):
        raise RestoreFailed(f"{data_dir} is not empty: restore builds a new data directory")


def _install(root: Path, data_dir: Path) -> None:
    """Move the checked directory into place: each part renamed into ``data_dir``, the
    version file last, so that a crash half-way leaves a directory the server refuses
    (no version file), never one it would serve with parts missing. The work's own
    lock file stays behind: ``data_dir``'s is held, and must stay the one held."""
    for part in root.iterdir():
        if part.name not in (VERSION_FILE, LOCK_FILE):
            part.rename(data_dir / part.name)
    fsio.fsync_dir(data_dir)
    (root / VERSION_FILE).rename(data_dir / VERSION_FILE)
    fsio.fsync_dir(data_dir)


def choose(backups: list[dict[str, Any]], backup_id: str | None, target: Target) -> dict[str, Any]:
    """The backup asked for, else the newest one at or before the target."""
    if backup_id:
        for m in backups:
            if m["id"] == backup_id:
                if target.lsn is not None and target.lsn < int(m["end_lsn"]):
                    raise RestoreFailed(
                        f"backup {backup_id} is consistent from lsn {m['end_lsn']} on: "
                        f"{target.describe()} is before it; choose an older backup"
                    )
                return m
        raise RestoreFailed(f"no finished backup {backup_id} in the archive")
    fit = [
        m
        for m in backups
        if (target.lsn is None or int(m["end_lsn"]) <= target.lsn)
        and (target.time is None or parse_time(str(m["time"])) <= target.time)
    ]
    if not backups:
        raise RestoreFailed("the archive holds no finished backup to restore from")
    if not fit:
        oldest = backups[0]
        raise RestoreFailed(
            f"no backup is at or before {target.describe()}: the oldest, {oldest['id']}, is "
            f"consistent from lsn {oldest['end_lsn']} ({oldest['time']})"
        )
    return fit[-1]


# ------------------------------------------------------------------ the backup


def fetch_backup(store: ObjectStore, manifest: dict[str, Any], root: Path) -> int:
    """The backup extracted into ``root``, every part and file checked; the bytes
    downloaded. A damaged part or file is a ``RestoreFailed`` naming it."""
    try:
        total = backup_fetch.fetch(store, manifest, root)
    except (backup_fetch.BackupDamaged, tarfile.TarError) as exc:
        raise RestoreFailed(str(exc)) from None
    for part in ("wal", "segments", "meta"):
        (root / part).mkdir(exist_ok=True)
    return total


# ------------------------------------------------------------------ the frames


def write_frames(
    store: ObjectStore, manifest: dict[str, Any], root: Path, target: Target
) -> Reached:
    """The archived frames after the backup, up to the target, as ``root``'s WAL."""
    start, consistent = int(manifest["start_lsn"]), int(manifest["end_lsn"])
    reached = Reached(int(manifest["term"]), start)
    history = catalog.newest_history(store)
    _check_on_history(manifest, history)
    upto = NO_END if target.lsn is None else target.lsn
    wal_path = root / "wal" / f"{WAL_NUMBER:016d}.wal"
    with wal_path.open("wb") as out:
        out.write(walmod.encode_header(WAL_NUMBER))
        ranges = history_ranges(history, upto)
        for i, (term, _first, last) in enumerate(ranges):
            if last <= reached.lsn:
                continue
            stop_time = None if target.time is None else target.time * 1e6
            done = _copy_term(store, out, term, last, reached, consistent, stop_time)
            if done:
                break
            if reached.lsn < last and (i + 1 < len(ranges) or target.lsn is not None):
                raise RestoreFailed(
                    f"the archive misses frames {reached.lsn + 1}..{last} of term {term} "
                    f"(after lsn {reached.lsn}): no object {_expected(term, reached.lsn + 1)}"
                )
    if reached.lsn < consistent:
        raise RestoreFailed(
            f"backup {manifest['id']} needs the archived frames up to lsn {consistent}; "
            f"the archive holds them only up to {reached.lsn}"
        )
    return reached


def _check_on_history(manifest: dict[str, Any], history: list[tuple[int, int]]) -> None:
    """A backup's position must be on the line the restore follows: the term that holds
    its lsn along the newest term's history must be the backup's own. A backup of a
    deposed primary's tail that the next term did not keep is refused, not mixed in."""
    term, lsn = int(manifest["term"]), int(manifest["start_lsn"])
    holder = None
    for t, first in history:
        if first <= lsn:
            holder = t
    if holder is not None and holder != term:
        raise RestoreFailed(
            f"backup {manifest['id']} (term {term}, lsn {lsn}) is not on the archive's "
            f"newest history {history}: lsn {lsn} there is term {holder}'s; choose another "
            "backup"
        )


def _expected(term: int, lsn: int) -> str:
    return f"wal/{term:016x}-* holding lsn {lsn}"


def _copy_term(
    store: ObjectStore,
    out: BinaryIO,
    term: int,
    last: int,
    reached: Reached,
    consistent: int,
    stop_time_us: float | None,
) -> bool:
    """Append ``term``'s frames after ``reached`` up to ``last``; True once the time
    target stopped the restore."""
    objects = catalog.term_objects(store, term)
    for i, (first, name) in enumerate(objects):
        if first > last:
            break
        if i + 1 < len(objects) and objects[i + 1][0] <= reached.lsn + 1:
            continue  # wholly before what is needed
        if first > reached.lsn + 1:
            raise RestoreFailed(
                f"the archive misses frames {reached.lsn + 1}..{first - 1} of term {term}: "
                f"no object holds them before {name}"
            )
        data = store.get(name)
        progress.note(len(data))
        for frame in decode_frames_object(name, data).frames:
            if frame.lsn <= reached.lsn:
                continue
            if frame.lsn > last:
                return False
            if stop_time_us is not None and frame.lsn > consistent and frame.time_us > stop_time_us:
                return True
            out.write(frame.frame)
            reached.term, reached.lsn, reached.time_us = term, frame.lsn, frame.time_us
            reached.frames += 1
            reached.bytes += len(frame.frame)
    return False


# ------------------------------------------------------------------ recovery


def recover(root: Path, manifest: dict[str, Any], reached: Reached) -> None:
    """The engine's own recovery on the restored directory, then its identity."""
    engine = Engine(root)
    _, report = engine.open()
    try:
        if report.damaged:
            sid, why = next(iter(report.damaged.items()))
            raise RestoreFailed(
                f"recovery of the restored data found stream id {sid} damaged: {why}"
            )
        layout = Layout(root)
        left = {
            "set": str(manifest.get("set") or layout.read_set_id()),
            "position": [reached.term, reached.lsn],
        }
        engine.write_metadata(
            [
                (walmod.DELETE, DB_INFO, KEY_POSITION),
                (walmod.DELETE, DB_INFO, KEY_TERMS),
                (walmod.PUT, DB_INFO, KEY_LEFT, json.dumps(left).encode()),
            ],
            flush=True,
        )
    finally:
        engine.close()
    fsio.unlink(Layout(root).set_id_file)
    _sync_tree(root)  # the extracted files too: recovery flushed only what it wrote


def _sync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file():
            fsio.fdatasync_path(path)
        else:
            fsio.fsync_dir(path)
    fsio.fsync_dir(root)
