"""A promoted replica cluster archives to its own location (docs/replica-clusters.md): its
archive begins after the frames it applied (those are in the archive it followed: no
gap, no error), its base backups name the term and history it writes under (term 1
after a single-node source), and a restore from its archive gives back every byte.
Real processes and a real object store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit import wait_for
from testkit.archive_follow import append, caught_up, create, follower, read, source
from testkit.archive_frames import run_command, upload_wal
from testkit.archive_reads import status
from testkit.archive_store import S3Store, object_store, server_args

pytestmark = pytest.mark.processes


def test_a_promoted_cluster_archives_backs_up_and_restores_under_its_own_term(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    bucket = archive_store.new_bucket()
    followed, own = bucket + "/source", bucket + "/promoted"
    src = source(server_factory, tmp_path)
    create(src, "a", b"followed ")
    for i in range(4):
        append(src, "a", b"%d " % i)
    last = upload_wal(src.data_dir, object_store(archive_store, followed))
    fol = follower(server_factory, tmp_path, archive_store, followed)
    caught_up(src, fol, ["a"])
    src.stop()
    fol.stop()

    promoted = fol
    promoted.args = [*server_args(archive_store, own), "--archive-timeout", "0.4"]
    promoted.start()
    append(promoted, "a", b"promoted ")
    create(promoted, "z", b"new")

    def archived_all() -> dict[str, Any] | None:
        doc: dict[str, Any] = status(promoted.url)
        return doc if doc["archived_lsn"] >= doc["durable_lsn"] > last else None

    done = wait_for(archived_all, timeout=60, message=lambda: str(status(promoted.url)))
    # The frames up to ``last`` are in the followed archive: not a gap, not an error.
    assert done["last_error"] is None and done["failing"] is False, done
    assert "in no local WAL file" not in promoted.log()
    assert done["archived_term"] == 1, done

    backup = httpx.post(f"{promoted.url}/_archive/backups", timeout=120)
    assert backup.status_code == 201, backup.text
    assert backup.json()["term"] == 1, backup.json()
    append(promoted, "a", b"after the backup")
    wait_for(archived_all, timeout=60, message=lambda: str(status(promoted.url)))
    expected = {p: read(promoted, p)[1] for p in ("a", "z")}
    promoted.stop()

    restored = tmp_path / "restored"
    where = ["--archive-url", own, "--archive-endpoint", archive_store.endpoint]
    code, out = run_command("restore", *where, "--data-dir", str(restored), env=archive_store.env())
    assert code == 0, out
    assert out["term"] == 1, out
    again = server_factory(data_dir=restored).start()
    assert {p: read(again, p)[1] for p in ("a", "z")} == expected

    # A replica cluster of the promoted one (a demoted former source rebuilt from its
    # backup, as the operator's Rebuild does): the backup carries term 1's record, and
    # the directory restored from it follows that archive all the same, across a restart;
    # promoted in turn, it writes under a term above its new source's.
    second = follower(server_factory, tmp_path, archive_store, own, name="second")
    caught_up(again, second, ["a", "z"])
    assert status(second.url)["failing"] is False
    second.stop()
    second.start()
    caught_up(again, second, ["a", "z"])
    second.stop()
    second.args = [*server_args(archive_store, bucket + "/third"), "--archive-timeout", "0.4"]
    second.start()
    append(second, "a", b"third")
    wait_for(
        lambda: status(second.url)["archived_term"] == 2,
        timeout=60,
        message=lambda: str(status(second.url)),
    )
