"""One damaged old backup blocks only the restores that need it (issue 41): a server
archiving for real, two base backups taken with the ``backup`` command, the older
one's manifest then garbled in the store. ``backups list`` names it and lists the
newer; a restore from the newer (asked for, or chosen as the newest) equals the
source; a restore from the damaged one is refused naming its manifest. ``backup``
and ``restore`` show their progress on stderr, and their stdout stays one JSON
document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from stream_format.archive import manifest_name
from testkit import wait_for
from testkit.archive_reads import status
from testkit.archive_store import S3Store
from testkit.server_process import ServerProcess
from testkit.servers import env_with
from testkit.stream_kinds import StreamKinds

pytestmark = pytest.mark.processes


def command(env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    """``durable-streams-server ARGS``: exit code, stdout's JSON, stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "stream_server", *args],
        env=env_with(env),
        capture_output=True,
        timeout=300,
        check=False,
    )
    return done.returncode, json.loads(done.stdout), done.stderr.decode()


def test_a_damaged_old_backup_blocks_only_the_restores_that_need_it(
    archive_store: S3Store, server_factory, tmp_path: Path
) -> None:
    url = archive_store.new_bucket() + "/site"
    env = archive_store.env()
    where = ["--archive-url", url, "--archive-endpoint", archive_store.endpoint]
    srv = server_factory(*where, "--archive-timeout", "0.3", env=env).start()
    kinds, ids = StreamKinds(), []
    with httpx.Client(timeout=10) as c:
        for _ in range(2):
            kinds.write_round(c, srv.url)
            code, done, err = command(env, "backup", "--server", srv.url)
            assert code == 0, (done, err)
            assert "backup: " in err and "MiB/s" in err and "(done)" in err, err
            ids.append(done["id"])
        kinds.write_round(c, srv.url)
    wait_for(
        lambda: (d := status(srv.url))["lag_frames"] == 0 and d["archived_lsn"] > 0,
        message=lambda: str(status(srv.url)),
    )
    srv.stop()
    old, new = ids
    bucket, prefix = url[5:].split("/", 1)
    archive_store.client().put_object(
        Bucket=bucket, Key=f"{prefix}/{manifest_name(old)}", Body=b"\x89garbled"
    )

    code, listed, _ = command(env, "backups", "list", *where)
    assert code == 0, listed
    assert [b["id"] for b in listed["backups"]] == [new]
    assert [(d["id"], d["key"]) for d in listed["damaged"]] == [(old, manifest_name(old))]

    for name, more in (("asked", ["--backup", new]), ("newest", [])):
        data_dir = tmp_path / name
        code, done, err = command(env, "restore", *where, "--data-dir", str(data_dir), *more)
        assert code == 0, (done, err)
        assert done["backup"] == new
        assert "restore: " in err and "objects" in err and "(done)" in err, err
        restored = ServerProcess(data_dir).start()
        try:
            with httpx.Client(timeout=10) as c:
                assert kinds.differences(c, restored.url) == []
        finally:
            restored.stop()

    code, done, _ = command(
        env, "restore", *where, "--data-dir", str(tmp_path / "x"), "--backup", old
    )
    assert code == 1 and manifest_name(old) in done["error"], done
    assert not (tmp_path / "x").exists()
