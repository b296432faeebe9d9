"""Backup retention: ``--backup-retention`` after each backup and ``backups prune`` by hand
delete the backups the policy does not keep (never the newest) and the frames objects
no kept backup replays, and nothing a kept backup needs: a restore from each kept
backup still equals the source."""

from __future__ import annotations

import time

import httpx
import pytest

from stream_format.archive import backup_id as make_backup_id
from stream_format.archive import part_name, wal_name
from stream_server.archive.backup.catalog import kept, manifests, term_objects
from testkit.archive_frames import copy_objects, copy_wal, run_command, store_for, upload_wal_frames
from testkit.archive_store import S3Store
from testkit.server_process import ServerProcess
from testkit.stream_kinds import StreamKinds

pytestmark = pytest.mark.processes


def test_the_server_keeps_the_newest_backups_its_policy_names(
    server_factory, archive_store
) -> None:
    url = archive_store.new_bucket()
    env = archive_store.env()
    args = ["--archive-url", url, "--archive-endpoint", archive_store.endpoint]
    srv = server_factory(*args, "--backup-retention", "last=2", env=env).start()
    # A backup a server was killed while taking, two days ago: parts and no manifest.
    stale = make_backup_id(time.time() - 2 * 86400, 1)
    archive_store.client().put_object(
        Bucket=url.removeprefix("s3://"), Key=part_name(stale, 1), Body=b"half a backup"
    )
    kinds, ids, unfinished = StreamKinds(), [], []
    with httpx.Client(timeout=10) as c:
        for _ in range(3):
            kinds.write_round(c, srv.url)
            code, done = run_command("backup", "--server", srv.url, env=env)
            assert code == 0, done
            ids.append(done["id"])
            unfinished.append(done["retention"]["deleted_unfinished"])
    assert done["retention"]["deleted_backups"] == ids[:1]
    assert unfinished == [[stale], [], []]  # past the grace: deleted after the first backup
    code, listed = run_command("backups", "list", *args, env=env)
    assert [b["id"] for b in listed["backups"]] == ids[1:]
    assert listed["unfinished"] == []


def test_pruning_deletes_what_no_kept_backup_needs_and_keeps_the_rest(
    archive_store: S3Store, tmp_path, monkeypatch
) -> None:
    bucket, env = archive_store.new_bucket(), archive_store.env()
    srv = ServerProcess(
        tmp_path / "data",
        "--archive-url",
        f"{bucket}/server",
        "--archive-endpoint",
        archive_store.endpoint,
        env=env,
    ).start()
    kinds = StreamKinds()
    try:
        with httpx.Client(timeout=10) as c:
            for _ in range(3):
                for _ in range(2):
                    kinds.write_round(c, srv.url)
                code, done = run_command("backup", "--server", srv.url, env=env)
                assert code == 0, done
            kinds.write_round(c, srv.url)
        wal = copy_wal(srv.data_dir, tmp_path / "wal")
    finally:
        srv.stop()
    copy_objects(archive_store, bucket, "server", "test", "backups/")
    url = f"{bucket}/test"
    store = store_for(archive_store, url, monkeypatch)
    frames = upload_wal_frames(store, wal, per_object=2)
    ends = {  # each object's last lsn
        wal_name(0, frames[i].lsn): frames[min(i + 1, len(frames) - 1)].lsn
        for i in range(0, len(frames), 2)
    }
    first, second, third = manifests(store)
    before = term_objects(store, 0)

    code, pruned = run_command(
        "backups",
        "prune",
        "--archive-url",
        url,
        "--archive-endpoint",
        archive_store.endpoint,
        "--keep",
        "last=2",
        env=env,
    )
    assert code == 0, pruned
    assert pruned["deleted_backups"] == [first["id"]]
    after = term_objects(store, 0)
    floor = second["start_lsn"]
    gone = {name for _, name in before} - {name for _, name in after}
    assert len(gone) == pruned["deleted_wal_objects"] > 0
    assert gone == {name for name, end in ends.items() if end <= floor}
    assert [m["id"] for m in manifests(store)] == [second["id"], third["id"]]

    for backup_id in (second["id"], third["id"]):
        code, done = run_command(
            "restore",
            "--archive-url",
            url,
            "--archive-endpoint",
            archive_store.endpoint,
            "--data-dir",
            str(tmp_path / backup_id),
            "--backup",
            backup_id,
            env=env,
        )
        assert code == 0, done
        restored = ServerProcess(tmp_path / backup_id).start()
        try:
            with httpx.Client(timeout=10) as c:
                assert kinds.differences(c, restored.url) == []
        finally:
            restored.stop()


def test_a_duration_keeps_younger_backups_and_always_the_newest() -> None:
    def at(day: int) -> dict:
        return {"id": f"b{day}", "time": f"2026-01-{day:02d}T00:00:00Z"}

    backups = [at(1), at(5), at(9)]
    now = 1767225600.0 + 10 * 86400  # 2026-01-11
    assert [b["id"] for b in kept(backups, "7d", now)] == ["b5", "b9"]
    assert [b["id"] for b in kept(backups, "12h", now)] == ["b9"]
    assert [b["id"] for b in kept(backups, "last=1", now)] == ["b9"]
    assert [b["id"] for b in kept(backups, "", now)] == ["b1", "b5", "b9"]
    with pytest.raises(ValueError, match="last=N"):
        kept(backups, "7 days", now)
