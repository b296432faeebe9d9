"""The catalog says what the archive really holds, and restore's arguments are checked
before anything is downloaded (issue 41).

The archives here are made by hand: manifests, parts and frames objects in the
format package's encoding, with frames that are only bytes (no restore replays
them: every restore here is refused before it would download). Listing and refusing
read names, manifests, headers and indexes only. The commands run as a user runs
them, in a child process, against a real SeaweedFS.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream_format.archive import (
    ArchivedFrame,
    backup_id,
    encode_frames_object,
    encode_manifest,
    manifest_name,
    part_name,
    rfc3339,
    wal_name,
)
from stream_server.archive.object_store import ObjectStore
from testkit.archive_frames import run_command, store_for
from testkit.archive_store import S3Store
from testkit.servers import env_with

pytestmark = pytest.mark.processes

T0 = 1_790_000_000.0  # 2026-09-21: every backup and frame is in the past
US = 1_000_000


def put_backup(store: ObjectStore, start: int, end: int, *, at: float) -> str:
    """A finished backup of one 100-byte part, consistent from ``end``: its id."""
    bid = backup_id(at, end)
    store.put_new(part_name(bid, 1), b"p" * 100)
    manifest = {
        "id": bid, "term": 0, "start_lsn": start, "end_lsn": end, "time": rfc3339(at),
        "parts": [{"name": part_name(bid, 1), "size": 100, "crc32": 0}], "files": [],
    }  # fmt: skip
    assert store.put_new(manifest_name(bid), encode_manifest(manifest))
    return bid


def put_frames(store: ObjectStore, first: int, last: int) -> str:
    """A frames object of lsns ``first..last`` under term 0, frame n committed at
    ``T0 + n`` seconds."""
    frames = [ArchivedFrame(n, int((T0 + n) * US), b"frame-%d" % n) for n in range(first, last + 1)]
    name = wal_name(0, first)
    assert store.put_new(name, encode_frames_object(0, frames))
    return name


def args(archive_store: S3Store, url: str) -> list[str]:
    return ["--archive-url", url, "--archive-endpoint", archive_store.endpoint]


def listed(archive_store: S3Store, url: str) -> dict:
    code, doc = run_command("backups", "list", *args(archive_store, url), env=archive_store.env())
    assert code == 0, doc
    return doc


def test_a_damaged_manifest_is_named_and_the_others_stay_listed(
    archive_store: S3Store, monkeypatch, tmp_path: Path
) -> None:
    url = archive_store.new_bucket() + "/a"
    store = store_for(archive_store, url, monkeypatch)
    old = put_backup(store, 1, 1, at=T0)
    lost_part = put_backup(store, 3, 3, at=T0 + 3)
    good = put_backup(store, 5, 5, at=T0 + 5)
    put_frames(store, 2, 9)
    bucket = url[5:].split("/")[0]
    client = archive_store.client()
    client.put_object(Bucket=bucket, Key=f"a/{manifest_name(old)}", Body=b"\x00{garbled")
    client.delete_object(Bucket=bucket, Key=f"a/{part_name(lost_part, 1)}")

    doc = listed(archive_store, url)
    assert [b["id"] for b in doc["backups"]] == [good]
    damaged = {d["id"]: d for d in doc["damaged"]}
    assert set(damaged) == {old, lost_part}
    assert damaged[old]["key"] == manifest_name(old)
    assert "not a backup manifest" in damaged[old]["reason"]
    assert damaged[lost_part]["key"] == part_name(lost_part, 1)
    assert "missing" in damaged[lost_part]["reason"]
    assert doc["recoverable"]["first_lsn"] == 5 and doc["recoverable"]["last_lsn"] == 9

    code, done = run_command(
        "restore", *args(archive_store, url), "--data-dir", str(tmp_path / "d"), "--backup", old,
        env=archive_store.env(),
    )  # fmt: skip
    assert code == 1 and f"--backup {old}: the backup is damaged" in done["error"], done
    assert manifest_name(old) in done["error"]


def test_a_gap_in_the_frames_ends_the_recoverable_interval(
    archive_store: S3Store, monkeypatch, tmp_path
) -> None:
    """Frames 1..3, 4..6 (lost), 7..9, 10..12: from the backup at lsn 2 a restore reaches
    3 and no further; the backup at 8 reaches 12."""
    url = archive_store.new_bucket() + "/g"
    store = store_for(archive_store, url, monkeypatch)
    early = put_backup(store, 2, 2, at=T0 + 2)
    names = [put_frames(store, n, n + 2) for n in (1, 4, 7, 10)]
    store.delete([names[1]])

    doc = listed(archive_store, url)
    assert doc["gaps"] == [{"term": 0, "first_lsn": 4, "last_lsn": 6, "before": names[2]}]
    assert doc["intervals"] == [
        {"first_lsn": 2, "first_time": rfc3339(T0 + 2), "last_lsn": 3,
         "last_time": rfc3339(T0 + 3), "backups": [early]},
    ]  # fmt: skip
    assert doc["recoverable"]["last_lsn"] == 3  # not 12: no restore gets there

    code, done = run_command(
        "restore", *args(archive_store, url), "--data-dir", str(tmp_path / "r"),
        env=archive_store.env(),
    )  # fmt: skip
    assert code == 1, done
    assert "misses frames 4..6 of term 0" in done["error"], done
    assert "--target-lsn 3" in done["error"] and not (tmp_path / "r").exists()

    late = put_backup(store, 8, 8, at=T0 + 8)
    doc = listed(archive_store, url)
    assert [(i["first_lsn"], i["last_lsn"], i["backups"]) for i in doc["intervals"]] == [
        (2, 3, [early]),
        (8, 12, [late]),
    ]
    assert (doc["recoverable"]["first_lsn"], doc["recoverable"]["last_lsn"]) == (2, 12)


def test_a_backup_whose_consistent_point_is_past_a_gap_is_unrestorable(
    archive_store: S3Store, monkeypatch
) -> None:
    url = archive_store.new_bucket() + "/u"
    store = store_for(archive_store, url, monkeypatch)
    bid = put_backup(store, 2, 8, at=T0 + 8)  # a single node's: replays 3..8 at least
    names = [put_frames(store, n, n + 2) for n in (1, 4, 7)]
    store.delete([names[1]])
    doc = listed(archive_store, url)
    assert doc["intervals"] == [] and doc["recoverable"] is None
    (blocked,) = doc["unrestorable"]
    assert blocked["id"] == bid and "misses frames 4..6" in blocked["reason"]


def test_unfinished_backups_are_listed_and_pruned_after_the_grace(
    archive_store: S3Store, monkeypatch
) -> None:
    url = archive_store.new_bucket() + "/p"
    store = store_for(archive_store, url, monkeypatch)
    kept = put_backup(store, 1, 1, at=T0)
    put_frames(store, 1, 3)
    stale, fresh = backup_id(T0 - 86400, 1), backup_id(time.time(), 3)
    for bid in (stale, fresh):
        store.put_new(part_name(bid, 1), b"x" * 10)
        store.put_new(part_name(bid, 2), b"y" * 5)
    doc = listed(archive_store, url)
    assert doc["unfinished"] == [
        {"id": stale, "parts": 2, "bytes": 15},
        {"id": fresh, "parts": 2, "bytes": 15},
    ]
    code, pruned = run_command(
        "backups", "prune", *args(archive_store, url), "--keep", "last=1", env=archive_store.env()
    )
    assert code == 0, pruned
    assert pruned["deleted_unfinished"] == [stale] and pruned["deleted_backups"] == []
    left = {name for name, _ in store.objects("backups/")}
    assert left == {
        manifest_name(kept),
        part_name(kept, 1),
        part_name(fresh, 1),
        part_name(fresh, 2),
    }


def restore_stderr(archive_store: S3Store, url: str, *more: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "stream_server", "restore", *args(archive_store, url), *more],
        env=env_with(archive_store.env()),
        capture_output=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--target-lsn", "-3"], "--target-lsn -3: an lsn is 1 or more"),
        (["--target-lsn", "0"], "--target-lsn 0: an lsn is 1 or more"),
        (["--target-time", "yesterday"], "--target-time 'yesterday': not an RFC 3339 time"),
        (["--target-time", "2026-11-26"], "--target-time '2026-11-26': not an RFC 3339 time"),
        (["--target-time", "2999-01-01T00:00:00Z"], "--target-time 2999-01-01T00:00:00Z is in the future"),
    ],
)  # fmt: skip
def test_a_wrong_target_is_refused_naming_its_flag(
    archive_store: S3Store, tmp_path: Path, flags: list[str], says: str
) -> None:
    url = archive_store.new_bucket() + "/args"
    code, out, _ = restore_stderr(archive_store, url, "--data-dir", str(tmp_path / "d"), *flags)
    assert code == 2, out
    assert says in out
    assert not (tmp_path / "d").exists()


def test_a_data_dir_that_is_a_file_is_refused_as_not_a_directory(
    archive_store: S3Store, tmp_path: Path
) -> None:
    url = archive_store.new_bucket() + "/file"
    where = tmp_path / "a-file"
    where.write_text("mine")
    code, out, _ = restore_stderr(archive_store, url, "--data-dir", str(where))
    assert code == 2, out
    assert "--data-dir" in out and "not a directory" in out
    assert where.read_text() == "mine"


def test_a_target_time_after_the_newest_frame_is_refused(
    archive_store: S3Store, monkeypatch, tmp_path: Path
) -> None:
    url = archive_store.new_bucket() + "/late"
    store = store_for(archive_store, url, monkeypatch)
    put_backup(store, 1, 1, at=T0 + 1)
    put_frames(store, 1, 4)
    after = rfc3339(T0 + 60)
    code, out, _ = restore_stderr(
        archive_store, url, "--data-dir", str(tmp_path / "d"), "--target-time", after
    )
    assert code == 1, out
    assert f"--target-time {after} is after the archive's newest frame, lsn 4" in out
