"""The archiver's objects are what restore reads: a base backup, more appends archived
by the server itself, kill -9 and the data directory given up, then
``durable-streams-server restore`` to the latest point; a server on the restored
directory serves every acknowledged byte (async: once the archive caught up;
required: at once)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from testkit import wait_for
from testkit.archive_frames import run_command
from testkit.archive_reads import status
from testkit.archive_store import S3Store
from testkit.server_process import ServerProcess
from testkit.stream_reads import read_all

pytestmark = pytest.mark.processes

TEXT = {"content-type": "text/plain"}


@pytest.mark.parametrize("mode", ["async", "required"])
def test_restore_from_the_archivers_objects_to_the_latest_point(
    mode: str, archive_store: S3Store, server_factory: Callable[..., ServerProcess], tmp_path
) -> None:
    """In required mode the kill comes right after the last acknowledgement: the
    recovery point objective is 0, nothing acknowledged may be missing."""
    url = archive_store.new_bucket() + "/r"
    where = ["--archive-url", url, "--archive-endpoint", archive_store.endpoint]
    timing = ["--archive-timeout", "0.3", "--archive-mode", mode]
    srv = server_factory(*where, *timing, env=archive_store.env()).start()
    sent = b""
    with httpx.Client(timeout=30) as c:
        assert c.put(srv.base + "s", headers=TEXT).status_code == 201
        for i in range(20):
            body = b"before-%02d;" % i
            assert c.post(srv.base + "s", content=body, headers=TEXT).is_success
            sent += body
        backup = c.post(f"{srv.url}/_archive/backups")
        assert backup.status_code == 201, backup.text
        for i in range(30):
            body = b"after-%02d;" % i
            assert c.post(srv.base + "s", content=body, headers=TEXT).is_success
            sent += body
    if mode == "async":
        wait_for(
            lambda: (d := status(srv.url))["lag_frames"] == 0 and d["archived_lsn"] > 0,
            message=lambda: str(status(srv.url)),
        )
    srv.kill()
    restored = tmp_path / "restored"
    code, out = run_command("restore", *where, "--data-dir", str(restored), env=archive_store.env())
    assert code == 0, out
    again = server_factory(data_dir=restored).start()
    assert read_all(again.base + "s") == sent
