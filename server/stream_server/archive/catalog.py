"""The backup catalog: which base backups an archive holds, how far it can restore, and
the retention that deletes old backups with the archived WAL only they needed.

A backup exists once its manifest does (``backups/<id>/manifest.json`` is written
last): parts without one are an unfinished or failed backup, never listed and never
restored from. Everything here reads the archive alone (no server): the server's
``GET /_archive/backups`` and the CLI's ``backups list`` print the same document.

The recoverable range runs from the oldest backup's consistent point (its
``end_lsn``: a restore must replay at least that far, docs/backup.md) to the last
archived frame along the newest term's history (PostgreSQL's
``recovery_target_timeline = latest``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stream_format.archive import (
    BACKUPS_PREFIX,
    HISTORY_PREFIX,
    INDEX_ROW,
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
    parse_wal_name,
)
from stream_format.archive import HEADER_SIZE as OBJECT_HEADER_SIZE
from stream_server.archive.object_store import ObjectStore
from stream_server.config.checks import parse_backup_retention

log = logging.getLogger("stream_server.archive")


def rfc3339(seconds: float) -> str:
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def parse_time(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (``Z`` or an offset; ValueError)."""
    when = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (end it with Z or +HH:MM)")
    return when.timestamp()


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


def manifests(store: ObjectStore) -> list[dict[str, Any]]:
    """Every finished backup's manifest, oldest first (ids sort by time)."""
    found = [decode_manifest(name, store.get(name)) for name in sorted(_manifest_names(store))]
    return sorted(found, key=lambda m: str(m["id"]))


def summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """A backup as ``POST``/``GET /_archive/backups`` and ``backups list`` show it."""
    keys = ("id", "term", "start_lsn", "end_lsn", "time", "started", "stopped", "node")
    out = {k: manifest.get(k) for k in keys}
    out["bytes"] = sum(int(p["size"]) for p in manifest["parts"])
    return out


def listing(store: ObjectStore) -> dict[str, Any]:
    found = manifests(store)
    return {"backups": [summary(m) for m in found], "recoverable": recoverable(store, found)}


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


def last_frame(store: ObjectStore, history: History) -> tuple[int, int] | None:
    """(lsn, commit time in µs) of the last archived frame along ``history``."""
    for i in range(len(history) - 1, -1, -1):
        term, first = history[i]
        cap = history[i + 1][1] - 1 if i + 1 < len(history) else None
        objects = [
            (lsn, name) for lsn, name in term_objects(store, term) if cap is None or lsn <= cap
        ]
        if not objects:
            continue
        name = objects[-1][1]
        _, object_first, object_last, _, _ = decode_header(
            name, store.get_range(name, 0, OBJECT_HEADER_SIZE)
        )
        lsn = object_last if cap is None else min(object_last, cap)
        if lsn >= max(first, object_first):
            return lsn, _commit_time(store, name, lsn - object_first)
    return None


def _commit_time(store: ObjectStore, name: str, row: int) -> int:
    """The commit time (µs) of an object's ``row``-th frame, read from its index alone
    (two small range reads instead of the whole object: the listing is polled)."""
    data = store.get_range(name, OBJECT_HEADER_SIZE + row * INDEX_ROW.size, INDEX_ROW.size)
    if len(data) != INDEX_ROW.size:
        raise ArchiveDamaged(f"archive object {name}: truncated in its index")
    return int(INDEX_ROW.unpack(data)[1])


def recoverable(store: ObjectStore, backups: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not backups:
        return None
    oldest, newest = backups[0], backups[-1]
    last_lsn, last_time = int(newest["end_lsn"]), str(newest["time"])
    found = last_frame(store, newest_history(store))
    if found is not None and found[0] > last_lsn:
        last_lsn, last_time = found[0], rfc3339(found[1] / 1e6)
    return {
        "first_lsn": int(oldest["end_lsn"]),
        "first_time": oldest["time"],
        "last_lsn": last_lsn,
        "last_time": last_time,
    }


# ------------------------------------------------------------------ retention


@dataclass(frozen=True)
class Pruned:
    backups: list[str]  # ids deleted
    wal_objects: int  # frames objects deleted

    def json(self) -> dict[str, Any]:
        return {"deleted_backups": self.backups, "deleted_wal_objects": self.wal_objects}


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


def prune(store: ObjectStore, policy: str, now: float | None = None) -> Pruned:
    """Delete the backups ``policy`` does not keep (each manifest first, so that a
    crash half-way leaves an unfinished backup, never a listed one missing parts),
    then the frames objects whose every frame is at or below the oldest kept
    backup's ``start_lsn``: no kept backup replays them."""
    backups = manifests(store)
    keep = kept(backups, policy, time.time() if now is None else now)
    ids = {str(b["id"]) for b in keep}
    gone = [str(b["id"]) for b in backups if str(b["id"]) not in ids]
    for backup_id in gone:
        store.delete([manifest_name(backup_id)])
        store.delete([name for name, _ in store.objects(backup_prefix(backup_id))])
        log.info("backup %s deleted by the retention policy %r", backup_id, policy)
    wal = 0
    if keep and gone:
        wal = _prune_wal(store, min(int(b["start_lsn"]) for b in keep))
    return Pruned(gone, wal)


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
