"""A backup of a replica set's in-sync standby, and what a restore of it is: single-node
data that left the source's set, which serves as a single node and seeds a new
replica set (a new set id, its standby copied from it), both equal to the source.

The source is a set of two real servers on the emulated API server's Lease; the
backup is taken on the standby (as CloudNativePG prefers), so its position is the
LMDB copy's ``replica_position``; the primary's WAL frames (term 1) are the archive.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from testkit.archive_frames import copy_objects, copy_wal, run_command, store_for, upload_wal_frames
from testkit.archive_store import S3Store
from testkit.cluster import Cluster, cluster
from testkit.replica_set_processes import STEADY, primary_with_standbys, start_member, status, until
from testkit.server_process import ServerProcess
from testkit.stream_kinds import StreamKinds

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def api() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def test_a_standbys_backup_restores_as_single_node_data_that_seeds_a_new_set(
    server_factory, api, archive_store: S3Store, tmp_path, monkeypatch
) -> None:
    bucket, env = archive_store.new_bucket(), archive_store.env()
    archive = ["--archive-url", f"{bucket}/server", "--archive-endpoint", archive_store.endpoint]
    members = [
        start_member(
            server_factory, api, "src", f"r{i}", set_size=2,
            timings=[*STEADY, *archive], env=env,
        )
        for i in range(2)
    ]  # fmt: skip
    primary = primary_with_standbys(members, 1)
    standby = next(m for m in members if m is not primary)
    kinds = StreamKinds()
    with httpx.Client(timeout=10) as c:
        for _ in range(2):
            kinds.write_round(c, primary.url)
        code, done = run_command("backup", "--server", standby.url, env=env)
        assert code == 0, done
        assert done["term"] == 1 and done["start_lsn"] == done["end_lsn"] > 0
        assert done["node"] == standby.args[standby.args.index("--replica-name") + 1]
        for _ in range(2):
            kinds.write_round(c, primary.url)
    source_set = (primary.data_dir / "SET_ID").read_text().strip()
    wal = copy_wal(primary.data_dir, tmp_path / "wal")
    for m in members:
        m.stop()
    copy_objects(archive_store, bucket, "server", "test", "backups/")
    url = f"{bucket}/test"
    upload_wal_frames(store_for(archive_store, url, monkeypatch), wal, term=1)

    def restore(name: str) -> ServerProcess:
        data_dir = tmp_path / name
        code, done = run_command(
            "restore", "--archive-url", url, "--archive-endpoint", archive_store.endpoint,
            "--data-dir", str(data_dir), env=env,
        )  # fmt: skip
        assert code == 0, done
        assert done["term"] == 1
        assert not (data_dir / "SET_ID").exists()
        return server_factory(data_dir=data_dir)

    alone = restore("alone").start()
    with httpx.Client(timeout=10) as c:
        assert kinds.primary_differences(c, alone.url) == []
    alone.stop()

    seed = restore("seed")
    boot = ["--replication-bootstrap", "n0"]
    first = start_member(
        server_factory, api, "dst", "n0", set_size=2, timings=[*STEADY, *boot],
        data_dir=seed.data_dir,
    )  # fmt: skip
    second = start_member(server_factory, api, "dst", "n1", set_size=2, timings=[*STEADY, *boot])
    new_primary = primary_with_standbys([first, second], 1)
    # Its Lease starts above the source's term 1, which the restored data names.
    assert new_primary is first and status(first)["term"] == 2
    new_set = (first.data_dir / "SET_ID").read_text().strip()
    assert new_set and new_set != source_set
    with httpx.Client(timeout=10) as c:
        assert kinds.differences(c, first.url) == []
        # The standby serves reads once it has the primary's commit point (it re-copied
        # the seed, restarted, and follows): it answers 503 until then.
        until(
            "the new standby to serve the source's data",
            lambda: not kinds.differences(c, second.url),
        )
