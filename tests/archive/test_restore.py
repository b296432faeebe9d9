"""Restore and point-in-time recovery against a real server and a real SeaweedFS: a base
backup taken by the server, frames objects of its WAL (``testkit.archive_frames``),
then ``durable-streams-server restore`` to the latest point, to an lsn and to a time.

A server started on the restored directory must show, byte for byte, what the
source had acknowledged up to the target: text and JSON streams (message
boundaries), an idempotent producer (its last append retried is a duplicate), a
closed stream, a fork, a subscription, and a stream whose retention dropped its
head (its retained start).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from stream_format.archive import ArchivedFrame, encode_history, history_name, parse_time
from stream_format.layout import LOCK_FILE
from stream_format.meta import DB_INFO
from stream_server.engine import dir_lock
from stream_server.engine.metadata import Metadata
from stream_server.engine.replica import KEY_LEFT, KEY_POSITION
from testkit import wait_for
from testkit.archive_frames import (
    copy_objects,
    copy_wal,
    run_command,
    upload_wal_frames,
    wal_frames,
)
from testkit.archive_store import S3Store
from testkit.server_process import ServerProcess
from testkit.stream_kinds import OCTET, StreamKinds
from testkit.stream_reads import read_all, stream_state

pytestmark = pytest.mark.processes

TRIMMED = "trim/a"  # under the retention rule below: its head is dropped
TRIM_BYTES = 8 * 1024
TRIM_RULE = "trim/:max-bytes=8KiB"


@dataclass
class Source:
    url: str  # the archive the tests restore from
    env: dict[str, str]
    round2: StreamKinds  # acknowledged after round 2
    round3: StreamKinds  # after round 3: the latest
    lsn2: int  # the last lsn of round 2
    time2: str  # a time between rounds 2 and 3 (RFC 3339)
    states2: dict[str, tuple[object, ...]]
    states3: dict[str, tuple[object, ...]]
    backup: str
    last: ArchivedFrame  # the last frame archived


PATHS = ("kinds/text", "kinds/json", "kinds/producer", "kinds/closed", "kinds/fork", TRIMMED)


def states(srv: ServerProcess) -> dict[str, tuple[object, ...]]:
    with httpx.Client(timeout=10) as c:
        return {p: stream_state(f"{srv.base}{p}", c) for p in PATHS}


def trim_round(srv: ServerProcess, n: int) -> None:
    with httpx.Client(timeout=10) as c:
        if n == 0:
            assert c.put(f"{srv.base}{TRIMMED}", headers=OCTET).status_code == 201
        for i in range(6):
            body = f"{n}.{i}:".encode() + b"t" * 1000
            assert c.post(f"{srv.base}{TRIMMED}", content=body, headers=OCTET).is_success
        # The sweeper drops the head asynchronously: the state is taken once it has.
        wait_for(lambda: len(read_all(f"{srv.base}{TRIMMED}", client=c)) <= TRIM_BYTES)


@pytest.fixture(scope="module")
def source(archive_store: S3Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Source]:
    bucket = archive_store.new_bucket()
    env = archive_store.env()
    root = tmp_path_factory.mktemp("source")
    archive = ["--archive-url", f"{bucket}/server", "--archive-endpoint", archive_store.endpoint]
    srv = ServerProcess(root / "data", *archive, "--retention", TRIM_RULE, env=env).start()
    try:
        kinds = StreamKinds()
        with httpx.Client(timeout=10) as c:
            for n in range(2):
                kinds.write_round(c, srv.url)
                trim_round(srv, n)
            code, backup = run_command("backup", "--server", srv.url, env=env)
            assert code == 0, backup
            kinds.write_round(c, srv.url)
            trim_round(srv, 2)
            round2, states2 = copy.deepcopy(kinds), states(srv)
            lsn2 = wal_frames(copy_wal(srv.data_dir, root / "wal2"))[-1].lsn
            time2 = time.time()
            kinds.write_round(c, srv.url)
            trim_round(srv, 3)
            states3 = states(srv)
        wal = copy_wal(srv.data_dir, root / "wal3")
    finally:
        srv.stop()
    url = f"{bucket}/test"
    assert copy_objects(archive_store, bucket, "server", "test", "backups/") >= 2
    with pytest.MonkeyPatch.context() as mp:
        from testkit.archive_frames import store_for

        last = upload_wal_frames(store_for(archive_store, url, mp), wal)[-1]
    stamp = (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time2)) + f".{int(time2 * 1e6) % 10**6:06d}Z"
    )
    yield Source(url, env, round2, kinds, lsn2, stamp, states2, states3, backup["id"], last)


def restore(source: Source, archive_store: S3Store, data_dir: Path, *more: str) -> tuple[int, dict]:
    return run_command(
        "restore",
        "--archive-url",
        source.url,
        "--archive-endpoint",
        archive_store.endpoint,
        "--data-dir",
        str(data_dir),
        *more,
        env=source.env,
    )


def check_restored(
    data_dir: Path, want: StreamKinds, states_: dict[str, tuple[object, ...]]
) -> None:
    srv = ServerProcess(data_dir).start()
    try:
        assert states(srv) == states_
        with httpx.Client(timeout=10) as c:
            assert want.primary_differences(c, srv.url) == []
    finally:
        srv.stop()


def test_a_restore_to_the_latest_point_equals_the_source(source, archive_store, tmp_path) -> None:
    code, done = restore(source, archive_store, tmp_path / "restored")
    assert code == 0, done
    assert done["backup"] == source.backup and done["frames"] > 0
    check_restored(tmp_path / "restored", source.round3, source.states3)


def test_a_restore_into_an_empty_volume_keeps_its_lost_and_found(
    source, archive_store, tmp_path
) -> None:
    """A new volume's mount point (empty but for ext4's lost+found), as the operator's
    init container restores into: the restore is built inside it and moved in place."""
    volume = tmp_path / "volume"
    (volume / "lost+found").mkdir(parents=True)
    code, done = restore(source, archive_store, volume)
    assert code == 0, done
    assert sorted(p.name for p in volume.iterdir()) == [
        ".lock", "FORMAT", "lost+found", "meta", "segments", "wal"
    ]  # fmt: skip
    check_restored(volume, source.round3, source.states3)


def test_a_restore_into_a_directory_another_process_holds_is_refused(
    source, archive_store, tmp_path
) -> None:
    """As a server holds its data directory (engine/dir_lock.py): here this test's own
    process holds it, and the restore command is another process."""
    held = tmp_path / "held"
    with dir_lock.holding(held):
        code, done = restore(source, archive_store, held)
    assert code == 2, done
    assert f"in use by process {os.getpid()} " in done["error"], done
    assert [p.name for p in held.iterdir()] == [LOCK_FILE]  # nothing restored into it


def test_a_restore_to_an_lsn_stops_there(source, archive_store, tmp_path) -> None:
    code, done = restore(
        source, archive_store, tmp_path / "at-lsn", "--target-lsn", str(source.lsn2)
    )
    assert code == 0, done
    assert done["lsn"] == source.lsn2
    check_restored(tmp_path / "at-lsn", source.round2, source.states2)


def test_a_restore_to_a_time_stops_before_the_first_frame_after_it(
    source, archive_store, tmp_path
) -> None:
    code, done = restore(source, archive_store, tmp_path / "at-time", "--target-time", source.time2)
    assert code == 0, done
    assert done["lsn"] == source.lsn2
    check_restored(tmp_path / "at-time", source.round2, source.states2)


def test_the_restored_directory_is_single_node_data_that_left_the_source(
    source, archive_store, tmp_path
) -> None:
    data_dir = tmp_path / "identity"
    code, done = restore(source, archive_store, data_dir)
    assert code == 0, done
    assert not (data_dir / "SET_ID").exists()
    assert not list((data_dir / "wal").iterdir())  # recovery ran and checkpointed
    meta = Metadata(data_dir / "meta", 1 << 30)
    try:
        with meta.env.begin() as txn:
            assert txn.get(KEY_POSITION, db=meta.dbs[DB_INFO]) is None
            left = json.loads(bytes(txn.get(KEY_LEFT, db=meta.dbs[DB_INFO])))
    finally:
        meta.close()
    assert left == {"set": "", "position": [0, done["lsn"]]}


def test_a_backup_after_the_target_is_refused(source, archive_store, tmp_path) -> None:
    code, done = restore(source, archive_store, tmp_path / "early", "--target-lsn", "1")
    assert code == 1
    assert "backup" in done["error"]
    assert not (tmp_path / "early").exists()


def test_a_data_directory_that_is_not_empty_is_refused(source, archive_store, tmp_path) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    code, done = restore(source, archive_store, target)
    assert code == 1 and "not empty" in done["error"]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_the_recoverable_range_ends_at_the_last_archived_frame(source, archive_store) -> None:
    args = ["--archive-url", source.url, "--archive-endpoint", archive_store.endpoint]
    code, listed = run_command("backups", "list", *args, env=source.env)
    assert code == 0, listed
    (backup,) = listed["backups"]
    assert listed["recoverable"]["first_lsn"] == backup["end_lsn"]
    assert listed["recoverable"]["last_lsn"] == source.last.lsn
    last_time = parse_time(listed["recoverable"]["last_time"])
    assert abs(last_time - source.last.time_us / 1e6) < 0.001


def test_a_backup_off_the_newest_history_is_refused(source, archive_store, tmp_path) -> None:
    """A later term that began before the backup's lsn (the backup was of a deposed
    primary's tail that the next term did not keep): refused, naming the backup."""
    bucket = source.url.rsplit("/", 1)[0]
    copy_objects(archive_store, bucket, "test", "off-line")
    history = encode_history(1, [(0, 1), (1, 3)])
    archive_store.client().put_object(
        Bucket=bucket[5:], Key=f"off-line/{history_name(1)}", Body=history
    )
    code, done = run_command(
        "restore", "--archive-url", f"{bucket}/off-line", "--archive-endpoint",
        archive_store.endpoint, "--data-dir", str(tmp_path / "off"), env=source.env,
    )  # fmt: skip
    assert code == 1 and "not on the archive's newest history" in done["error"]
    assert source.backup in done["error"] and not (tmp_path / "off").exists()


def test_a_target_lsn_past_the_archive_is_refused(source, archive_store, tmp_path) -> None:
    beyond = source.last.lsn + 5
    code, done = restore(source, archive_store, tmp_path / "beyond", "--target-lsn", str(beyond))
    assert code == 1
    assert f"misses frames {source.last.lsn + 1}..{beyond}" in done["error"]
    assert not (tmp_path / "beyond").exists()
