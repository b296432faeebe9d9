"""``restore``'s arguments checked before a byte is downloaded, each refusal naming the
flag at fault (docs/backup.md, "What restore refuses").

Two kinds, two exit statuses, as argparse and the rest of the command have them:

- ``BadArgument`` (exit 2): wrong whatever the archive holds: a ``--target-lsn``
  below 1, a ``--target-time`` that is not RFC 3339 or is in the future, a
  ``--data-dir`` that is a file;
- ``RestoreFailed`` (exit 1): the archive cannot give what was asked: no such backup,
  a damaged one, a target before every backup or beyond the frames a backup reaches
  (past the archive's newest frame, or across a gap in the archived frames).

``plan`` also decides which backup a restore without ``--backup`` starts from: the
newest one at or before the target that is intact and whose frames reach its
consistent point, so that one damaged backup blocks only the restores that need it.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from stream_format.archive import parse_time, rfc3339
from stream_server.archive.backup import catalog, coverage
from stream_server.archive.backup.restore import IGNORED, RestoreFailed, Target, choose
from stream_server.archive.object_store import ObjectStore

log = logging.getLogger("stream_server.archive")

RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


class BadArgument(ValueError):
    """An argument wrong in itself (exit 2); the message names the flag."""


def target(lsn: int | None, when: str | None, now: float | None = None) -> Target:
    """The target the flags give, checked without the archive."""
    if lsn is not None and lsn < 1:
        raise BadArgument(f"--target-lsn {lsn}: an lsn is 1 or more (the first frame's)")
    if when is None:
        return Target(lsn=lsn)
    text = when.strip()
    if not RFC3339.fullmatch(text):
        raise BadArgument(
            f"--target-time {when!r}: not an RFC 3339 time (like 2026-11-26T04:44:18Z or "
            "2026-11-26T05:44:18.5+01:00)"
        )
    try:
        seconds = parse_time(text)
    except ValueError as exc:
        raise BadArgument(f"--target-time {when!r}: {exc}") from None
    now = time.time() if now is None else now
    if seconds > now:
        raise BadArgument(
            f"--target-time {when} is in the future (now is {rfc3339(now)}): the "
            "archive cannot hold frames after now; leave it out for the latest point"
        )
    return Target(time=seconds)


def data_dir(path: Path) -> None:
    """``--data-dir`` must be a directory (or absent) and empty: refused before the
    archive is read. A file is a wrong argument (exit 2); a directory holding data
    stays the ``RestoreFailed`` (exit 1) it always was."""
    if path.exists() and not path.is_dir():
        raise BadArgument(f"--data-dir {path} is a file, not a directory")
    if path.is_dir() and any(p.name not in IGNORED for p in path.iterdir()):
        raise RestoreFailed(f"--data-dir {path} is not empty: restore builds a new data directory")


def plan(store: ObjectStore, backup_id: str | None, goal: Target) -> str:
    """The id of the backup to restore from, once the archive showed it can reach
    ``goal`` from it; ``RestoreFailed`` naming the flag, the backup or the gap if not."""
    found = catalog.backups(store)
    history = catalog.newest_history(store)
    cover = coverage.scan(store, history)
    reach = coverage.reaches(found.intact, history, cover)
    manifest = _asked(found, backup_id, goal) if backup_id else _newest_fit(found, reach, goal)
    reached = reach[str(manifest["id"])]
    if isinstance(reached, str):
        raise RestoreFailed(f"backup {manifest['id']} cannot be restored: {reached}")
    _check_reach(store, manifest, reached, cover, goal)
    return str(manifest["id"])


def _asked(found: catalog.Backups, backup_id: str, goal: Target) -> dict[str, Any]:
    for bad in found.damaged:
        if bad.id == backup_id:
            raise RestoreFailed(
                f"--backup {backup_id}: the backup is damaged: {bad.key}: {bad.reason}"
            )
    if any(u.id == backup_id for u in found.unfinished):
        raise RestoreFailed(
            f"--backup {backup_id}: an unfinished backup (parts without a manifest): nothing to "
            "restore from"
        )
    manifest = next((m for m in found.intact if m["id"] == backup_id), None)
    if manifest is None:
        raise RestoreFailed(
            f"--backup {backup_id}: no finished backup of that id in the archive (`backups "
            "list` shows them)"
        )
    if goal.lsn is not None and goal.lsn < int(manifest["end_lsn"]):
        raise RestoreFailed(
            f"--target-lsn {goal.lsn} is before backup {backup_id}'s consistent point, lsn "
            f"{manifest['end_lsn']}: choose an older backup"
        )
    if goal.time is not None and goal.time < parse_time(str(manifest["time"])):
        raise RestoreFailed(
            f"--target-time {rfc3339(goal.time)} is before backup {backup_id}'s "
            f"consistent point ({manifest['time']}): choose an older backup"
        )
    return manifest


def _newest_fit(
    found: catalog.Backups, reach: dict[str, int | str], goal: Target
) -> dict[str, Any]:
    """The newest restorable backup at or before ``goal``; the others passed over are
    logged (stderr), each with its reason."""
    if not found.intact:
        damaged = "; ".join(f"backup {d.id}: {d.key}: {d.reason}" for d in found.damaged)
        raise RestoreFailed(
            "the archive holds no finished backup to restore from"
            + (f" (damaged: {damaged})" if damaged else "")
        )
    flag = _flag(goal)
    try:
        before = choose(found.intact, None, goal)  # the newest at or before the target
    except RestoreFailed as exc:
        raise RestoreFailed(f"{flag}{exc}") from None
    fits = [m for m in found.intact if str(m["id"]) <= str(before["id"])]
    usable = [m for m in fits if isinstance(reach[str(m["id"])], int)]
    chosen = str(usable[-1]["id"]) if usable else ""
    for m in fits:
        if str(m["id"]) > chosen:
            log.warning("backup %s passed over: %s", m["id"], reach[str(m["id"])])
    for bad in found.damaged:
        if bad.id is not None and chosen < bad.id <= str(before["id"]):
            log.warning("backup %s passed over: damaged: %s: %s", bad.id, bad.key, bad.reason)
    if not usable:
        newest = fits[-1]
        raise RestoreFailed(
            f"{flag}no backup at or before {goal.describe()} can be restored: the newest, "
            f"{newest['id']}: {reach[str(newest['id'])]}"
        )
    return usable[-1]


def _flag(goal: Target) -> str:
    if goal.lsn is not None:
        return f"--target-lsn {goal.lsn}: "
    if goal.time is not None:
        return f"--target-time {rfc3339(goal.time)}: "
    return ""


def _check_reach(
    store: ObjectStore,
    manifest: dict[str, Any],
    reached: int,
    cover: coverage.Coverage,
    goal: Target,
) -> None:
    """``goal`` must lie within what the frames after ``manifest`` reach."""
    backup_id = manifest["id"]
    gap = cover.gap_after(reached)
    piece = cover.holder(reached)
    if piece is not None and reached > int(manifest["start_lsn"]):
        last_time = coverage.frame_time_us(store, piece, reached) / 1e6
    else:
        last_time = parse_time(str(manifest["time"]))
    at = f"lsn {reached} ({rfc3339(last_time)})"
    if goal.lsn is not None:
        if goal.lsn <= reached:
            return
        if gap is not None:
            raise RestoreFailed(
                f"--target-lsn {goal.lsn}: {gap.describe()}; from backup {backup_id} a "
                f"restore reaches {at} at most"
            )
        raise RestoreFailed(
            f"--target-lsn {goal.lsn} is past the archive's last frame, {at}: the archive "
            f"misses frames {reached + 1}..{goal.lsn}"
        )
    if goal.time is not None:
        if last_time > goal.time:
            return  # the restore stops at a frame committed after the target
        if gap is not None:
            raise RestoreFailed(
                f"--target-time {rfc3339(goal.time)}: {gap.describe()}, and the "
                f"frames before it, up to {at}, are all before the target"
            )
        raise RestoreFailed(
            f"--target-time {rfc3339(goal.time)} is after the archive's newest frame, "
            f"{at}: the archive cannot tell what was written after it; leave the target out "
            "for the latest point"
        )
    if gap is not None:
        raise RestoreFailed(
            f"{gap.describe()}: a restore to the latest point would lose the frames after it "
            f"(up to lsn {cover.newest}); from backup {backup_id} a restore reaches {at} at "
            f"most: ask for it with --target-lsn {reached}, or restore from a backup taken "
            "after the gap"
        )
