"""A replica cluster end to end on the real parts: the source archives with its own
archiver and takes a base backup; a follower started on an empty directory restores
that backup (the restore command's code), then applies what was archived after it,
and keeps following; it takes no backup of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.archive_follow import append, archived, archiving_source, caught_up, create, follower
from testkit.archive_store import S3Store

pytestmark = pytest.mark.processes

PATHS = ["a", "b/c", "j"]

JSON = {"content-type": "application/json"}


def test_a_follower_starts_from_the_newest_backup_then_follows(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    url = archive_store.new_bucket() + "/src"
    src = archiving_source(server_factory, tmp_path, archive_store, url)
    create(src, "a", b"before the backup ")
    create(src, "b/c", b"x" * 5000)
    create(src, "j", b'[{"n": 1}]', JSON)
    backup = httpx.post(f"{src.url}/_archive/backups", timeout=120)
    assert backup.status_code == 201, backup.text
    backed_up = backup.json()["end_lsn"]
    append(src, "a", b"after the backup ")
    append(src, "j", b'{"n": 2}', JSON)
    archived(src)

    fol = follower(server_factory, tmp_path, archive_store, url)
    caught_up(src, fol, PATHS)
    st = httpx.get(f"{fol.url}/_archive/status", timeout=5).json()
    assert st["role"] == "following"
    assert st["applied_lsn"] > backed_up
    # Restored from the backup and the frames after it, not replayed from lsn 1.
    assert f"restored {url}" in fol.log()
    assert "following" in fol.log() and "from lsn 1\n" not in fol.log()

    append(src, "a", b"while following")
    archived(src)
    caught_up(src, fol, PATHS)

    refused = httpx.post(f"{fol.url}/_archive/backups", timeout=30)
    assert refused.status_code == 409
    assert "replica cluster" in refused.json()["error"]


def test_a_follower_from_a_backup_keeps_following_batch_after_batch_and_restarts(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    """Restored from a backup, the follower records the terms of the frames it restored
    (those it compares with the source's history before each batch): batch after batch
    it keeps applying, also after restarts, one before it applied any frame itself."""
    url = archive_store.new_bucket() + "/src"
    src = archiving_source(server_factory, tmp_path, archive_store, url)
    create(src, "a", b"restored ")
    backup = httpx.post(f"{src.url}/_archive/backups", timeout=120)
    assert backup.status_code == 201, backup.text
    archived(src)

    fol = follower(server_factory, tmp_path, archive_store, url)
    caught_up(src, fol, ["a"])
    fol.stop()
    fol.start()  # a restart before it applied a frame of its own
    for i in range(3):
        if i == 2:
            fol.stop()
            fol.start()
        append(src, "a", b"batch %d " % i)
        archived(src)
        caught_up(src, fol, ["a"])
    st = httpx.get(f"{fol.url}/_archive/status", timeout=5).json()
    assert st["failing"] is False and st["last_error"] is None, st
    assert "must be rebuilt" not in fol.log()
