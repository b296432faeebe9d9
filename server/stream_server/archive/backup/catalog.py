"""The backup catalog: which base backups an archive holds, how far it can restore, and
the retention that deletes old backups with the archived WAL only they needed.

A backup exists once its manifest does (``backups/<id>/manifest.json`` is written
last): parts without one are an unfinished or failed backup, listed apart, never
restored from, deleted by retention after a grace period (a backup still being taken
must not lose its parts). Everything here reads the archive alone (no server): the server's
``GET /_archive/backups`` and the CLI's ``backups list`` print the same document.

A damaged backup (a manifest that does not decode, a part missing or of the wrong
size) is named with the reason and left out, never the whole listing failed: one bad
old object must not hide the good backups beside it.

What is recoverable is a list of intervals, not one range: from each restorable
backup's consistent point (its ``end_lsn``: a restore must replay at least that far,
docs/backup.md) through the frames objects that follow it without a gap, along the
newest term's history (PostgreSQL's ``recovery_target_timeline = latest``). A gap
(a frames object lost) ends an interval; frames after it are reachable only from a
backup taken after it (``coverage.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from stream_format.archive import (
    BACKUPS_PREFIX,
    HISTORY_PREFIX,
    MANIFEST_NAME,
    SINGLE_NODE_HISTORY,
    WAL_PREFIX,
    ArchiveDamaged,
    History,
    backup_id_time,
    backup_prefix,
    decode_header,
    decode_history,
    decode_manifest,
    manifest_name,
    parse_time,
    parse_wal_name,
    rfc3339,
)
from stream_format.archive import HEADER_SIZE as OBJECT_HEADER_SIZE
from stream_server.archive.backup import coverage
from stream_server.archive.object_store import ArchiveMissing, ObjectStore
from stream_server.declared.checks import parse_backup_retention

log = logging.getLogger("stream_server.archive")


# ------------------------------------------------------------------ backups


def _manifest_names(store: ObjectStore) -> list[str]:
    """``backups/<id>/manifest.json`` of every finished backup."""
    return [
        name
        for name, _ in store.objects(BACKUPS_PREFIX)
        if name.endswith("/" + MANIFEST_NAME) and name.count("/") == 2
    ]


def newest_backup_time(store: ObjectStore) -> float | None:
    """When the newest finished backup was taken (seconds since the epoch), from the
    names alone: an id begins with its UTC time (``backup_id``), so no manifest is
    read. None: no backup."""
    newest: float | None = None
    for name in _manifest_names(store):
        try:
            when = backup_id_time(name[len(BACKUPS_PREFIX) :])
        except ValueError:
            continue  # not one of ours
        newest = when if newest is None else max(newest, when)
    return newest


@dataclass(frozen=True)
class Damaged:
    """An object a backup (``id``), or the frames (``id`` None), cannot be read from."""

    id: str | None
    key: str  # the object at fault, or the frames missing
    reason: str

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "reason": self.reason}


@dataclass(frozen=True)
class Unfinished:
    """Parts without a manifest: a backup that failed, or one still being taken."""

    id: str
    parts: int
    bytes: int

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "parts": self.parts, "bytes": self.bytes}


@dataclass
class Backups:
    intact: list[dict[str, Any]]  # manifests, oldest first
    damaged: list[Damaged]
    unfinished: list[Unfinished]


def backups(store: ObjectStore) -> Backups:
    """Every backup under ``backups/``, sorted by what can be done with it. One listing,
    one GET per manifest: a manifest that does not decode, or whose parts are not all
    listed at the sizes it gives, makes its backup damaged (named, with the reason),
    never the listing fail: other backups stay usable. Parts' checksums are checked by
    the restore that downloads them, not here."""
    groups: dict[str, dict[str, int]] = {}
    for name, size in store.objects(BACKUPS_PREFIX):
        if name.count("/") == 2:
            groups.setdefault(name.split("/")[1], {})[name] = size
    out = Backups([], [], [])
    for backup_id in sorted(groups):
        objects, name = groups[backup_id], manifest_name(backup_id)
        if name not in objects:
            out.unfinished.append(Unfinished(backup_id, len(objects), sum(objects.values())))
            continue
        try:
            manifest = decode_manifest(name, store.get(name))
            problem = _parts_problem(backup_id, manifest, objects)
        except ArchiveMissing:
            continue  # deleted since the listing (a prune): not a backup any more
        except ArchiveDamaged as exc:
            problem = (name, str(exc))
        if problem is None:
            out.intact.append(manifest)
        else:
            out.damaged.append(Damaged(backup_id, *problem))
    return out


def _parts_problem(
    backup_id: str, manifest: dict[str, Any], objects: dict[str, int]
) -> tuple[str, str] | None:
    """(object, why) when the listing shows the backup cannot be whole."""
    name = manifest_name(backup_id)
    try:
        if manifest["id"] != backup_id:
            return name, f"the manifest is backup {manifest['id']}'s"
        for part in manifest["parts"]:
            part_name, size = str(part["name"]), int(part["size"])
            if part_name not in objects:
                return (
                    part_name,
                    "missing (NoSuchKey): the manifest lists it, the archive holds none",
                )
            if objects[part_name] != size:
                return (
                    part_name,
                    f"{objects[part_name]} bytes, the manifest says {size} (truncated or replaced)",
                )
    except (KeyError, TypeError, ValueError) as exc:
        return name, f"not a backup manifest ({type(exc).__name__}: {exc})"
    return None


def manifests(store: ObjectStore) -> list[dict[str, Any]]:
    """Every intact backup's manifest, oldest first (ids sort by time)."""
    return backups(store).intact


def summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """A backup as ``POST``/``GET /_archive/backups`` and ``backups list`` show it."""
    keys = ("id", "term", "start_lsn", "end_lsn", "time", "started", "stopped", "node")
    out = {k: manifest.get(k) for k in keys}
    out["bytes"] = sum(int(p["size"]) for p in manifest["parts"])
    return out


def listing(store: ObjectStore) -> dict[str, Any]:
    """The document ``backups list`` prints and ``GET /_archive/backups`` answers."""
    found = backups(store)
    history = newest_history(store)
    cover = coverage.scan(store, history)
    reach = coverage.reaches(found.intact, history, cover)
    intervals = recoverable_intervals(store, found.intact, reach, cover)
    return {
        "backups": [summary(m) for m in found.intact],
        "recoverable": envelope(intervals),
        "intervals": intervals,
        "gaps": [g.json() for g in cover.gaps],
        "damaged": [d.json() for d in found.damaged]
        + [Damaged(None, name, why).json() for name, why in cover.damaged],
        "unrestorable": [
            {"id": backup_id, "reason": why}
            for backup_id, why in reach.items()
            if isinstance(why, str)
        ],
        "unfinished": [u.json() for u in found.unfinished],
    }


# ------------------------------------------------------------------ the WAL archive


def newest_history(store: ObjectStore) -> History:
    """The term history of the newest term archived (a single node's when none is)."""
    names = sorted(name for name, _ in store.objects(HISTORY_PREFIX))
    if not names:
        return list(SINGLE_NODE_HISTORY)
    return decode_history(names[-1], store.get(names[-1]))


def term_objects(store: ObjectStore, term: int) -> list[tuple[int, str]]:
    """(first lsn, name) of each frames object of ``term``, in lsn order."""
    found = []
    for name, _ in store.objects(f"{WAL_PREFIX}{term:016x}-"):
        found.append((parse_wal_name(name)[1], name))
    return sorted(found)


def recoverable_intervals(
    store: ObjectStore,
    backups: list[dict[str, Any]],
    reach: dict[str, int | str],
    cover: coverage.Coverage,
) -> list[dict[str, Any]]:
    """The lsn (and time) intervals a restore can stop anywhere in: from each
    restorable backup's consistent point to the end of the contiguous frames after it.
    Backups reaching the same end share one interval (oldest first)."""
    by_end: dict[int, list[dict[str, Any]]] = {}
    for m in backups:
        end = reach[str(m["id"])]
        if isinstance(end, int):
            by_end.setdefault(end, []).append(m)
    out = []
    for end in sorted(by_end):
        group = by_end[end]
        piece = cover.holder(end)
        if piece is not None and end > int(group[-1]["start_lsn"]):
            last_time = rfc3339(coverage.frame_time_us(store, piece, end) / 1e6)
        else:  # no frame after the newest backup: it is the last point
            last_time = str(group[-1]["time"])
        out.append(
            {
                "first_lsn": int(group[0]["end_lsn"]),
                "first_time": str(group[0]["time"]),
                "last_lsn": end,
                "last_time": last_time,
                "backups": [str(m["id"]) for m in group],
            }
        )
    return out


def envelope(intervals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """From the first interval's start to the last one's end (what a restore to the
    latest point reaches): the shape clients read before the intervals were listed.
    Between the two ends only the intervals are restorable."""
    if not intervals:
        return None
    keys = ("first_lsn", "first_time")
    return {
        **{k: intervals[0][k] for k in keys},
        "last_lsn": intervals[-1]["last_lsn"],
        "last_time": intervals[-1]["last_time"],
    }


# ------------------------------------------------------------------ retention


UNFINISHED_GRACE = 24 * 3600.0  # seconds an unfinished backup is left to finish


@dataclass(frozen=True)
class Pruned:
    backups: list[str]  # ids deleted
    wal_objects: int  # frames objects deleted
    unfinished: list[str]  # ids of unfinished backups whose parts were deleted

    def json(self) -> dict[str, Any]:
        return {
            "deleted_backups": self.backups,
            "deleted_wal_objects": self.wal_objects,
            "deleted_unfinished": self.unfinished,
        }


def kept(backups: list[dict[str, Any]], policy: str, now: float) -> list[dict[str, Any]]:
    """The backups a retention policy keeps (``--backup-retention``); the newest always."""
    seconds, last = parse_backup_retention(policy)
    if not backups or (seconds is None and last is None):
        return list(backups)
    if last is not None:
        return backups[-last:]
    assert seconds is not None
    young = [b for b in backups[:-1] if now - parse_time(str(b["time"])) < seconds]
    return [*young, backups[-1]]


def prune(
    store: ObjectStore,
    policy: str,
    now: float | None = None,
    unfinished_grace: float = UNFINISHED_GRACE,
) -> Pruned:
    """Delete the backups ``policy`` does not keep (each manifest first, so that a
    crash half-way leaves an unfinished backup, never a listed one missing parts),
    then the frames objects whose every frame is at or below the oldest kept
    backup's ``start_lsn``: no kept backup replays them; then the parts of unfinished
    backups begun more than ``unfinished_grace`` seconds ago (their id's time: a
    backup still being taken is younger than that). Damaged backups are left for a
    person to look at: ``backups list`` names them."""
    now = time.time() if now is None else now
    found = backups(store)
    keep = kept(found.intact, policy, now)
    ids = {str(b["id"]) for b in keep}
    gone = [str(b["id"]) for b in found.intact if str(b["id"]) not in ids]
    for backup_id in gone:
        store.delete([manifest_name(backup_id)])
        store.delete([name for name, _ in store.objects(backup_prefix(backup_id))])
        log.info("backup %s deleted by the retention policy %r", backup_id, policy)
    wal = 0
    if keep and gone:
        wal = _prune_wal(store, min(int(b["start_lsn"]) for b in keep))
    return Pruned(gone, wal, _prune_unfinished(store, found.unfinished, now, unfinished_grace))


def _prune_unfinished(
    store: ObjectStore, unfinished: list[Unfinished], now: float, grace: float
) -> list[str]:
    """Delete the parts of unfinished backups older than ``grace``; their ids."""
    gone = []
    for backup in unfinished:
        try:
            begun = backup_id_time(backup.id)
        except ValueError:
            continue  # not a name of ours: left alone
        if now - begun < grace:
            continue  # maybe still being taken
        names = [name for name, _ in store.objects(backup_prefix(backup.id))]
        if manifest_name(backup.id) in names:
            continue  # finished since the listing
        store.delete(names)
        gone.append(backup.id)
        log.info("unfinished backup %s (%d parts) deleted", backup.id, len(names))
    return gone


def _prune_wal(store: ObjectStore, floor: int) -> int:
    """Delete frames objects holding only frames at or below ``floor``."""
    by_term: dict[int, list[tuple[int, str]]] = {}
    for name, _ in store.objects(WAL_PREFIX):
        try:
            term, first = parse_wal_name(name)
        except ArchiveDamaged:
            continue  # not ours: left alone
        by_term.setdefault(term, []).append((first, name))
    doomed: list[str] = []
    for objects in by_term.values():
        objects.sort()
        for i, (first, name) in enumerate(objects):
            if first > floor:
                break
            if i + 1 < len(objects):
                last = objects[i + 1][0] - 1
            else:  # the term's last object: its header says where it ends
                last = decode_header(name, store.get_range(name, 0, OBJECT_HEADER_SIZE))[2]
            if last <= floor:
                doomed.append(name)
    store.delete(doomed)
    return len(doomed)
