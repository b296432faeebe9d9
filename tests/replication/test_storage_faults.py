"""Storage faults in a replica set, real processes and real files.

A primary whose storage fails closed must hand the set on, not hold the Lease
while refusing every write; a standby whose disk fills must leave the in-sync
set without stopping the primary's acknowledgements, and rejoin once space
returns. What was acknowledged is on the replicas that carry on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.replica_set_processes import FAST, primary_with_standbys, start_member, status, until
from testkit.server_process import ServerProcess
from testkit.stream_reads import read_all

pytestmark = pytest.mark.processes

BIN = {"Content-Type": "application/octet-stream"}


def _member(
    server_factory, api: Cluster, lease: str, name: str, *, data_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:  # fmt: skip
    return start_member(server_factory, api, lease, name, timings=FAST, data_dir=data_dir, env=env)


def _post(url: str, body: bytes) -> int:
    try:
        return httpx.post(url, headers=BIN, content=body, timeout=30).status_code
    except httpx.HTTPError:
        return 0


def test_a_primary_whose_storage_fails_closed_hands_the_set_on(server_factory, api: Cluster):
    # r0 starts alone, so it is the primary; its 12th WAL flush fails with EIO.
    r0 = _member(server_factory, api, "eio", "r0", env={"DS_FAULT": "eio:fsync:12"})
    until("r0 primary", lambda: status(r0)["role"] == "primary")
    servers = [r0] + [_member(server_factory, api, "eio", f"r{i}") for i in (1, 2)]
    assert primary_with_standbys(servers, 2) is r0
    url = f"{r0.base}eio"
    assert httpx.put(url, headers=BIN).status_code == 201
    acked = b""
    for i in range(30):
        body = f"write {i};".encode()
        code = _post(url, body)
        if code != 204:
            break
        acked += body
    assert code == 503, code
    assert "failed closed" in httpx.get(f"{r0.url}/readyz").text

    # A standby takes over within a few lease rounds, holding every acknowledged write.
    def new_primary() -> ServerProcess | None:
        for srv in servers[1:]:
            st = status(srv)
            if st["role"] == "primary" and st["term"] > 1:
                return srv
        return None

    successor = until("a standby to take over from the failed primary", new_primary)
    assert isinstance(successor, ServerProcess)
    assert read_all(f"{successor.base}eio") in (acked, acked + f"write {i};".encode())
    assert _post(f"{successor.base}eio", b"after;") == 204
    assert status(r0)["role"] != "primary"


@pytest.mark.skipif(
    os.geteuid() != 0, reason="mounting a small filesystem needs root (CI runs as root)"
)
def test_a_standby_with_a_full_disk_leaves_the_in_sync_set_and_rejoins(
    server_factory, api: Cluster, tmp_path: Path
):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {mounted.stderr.strip()}")
    try:
        r0 = _member(server_factory, api, "full", "r0")
        until("r0 primary", lambda: status(r0)["role"] == "primary")
        r1 = _member(server_factory, api, "full", "r1")
        small = _member(server_factory, api, "full", "r2", data_dir=mnt / "data")
        servers = [r0, r1, small]
        assert primary_with_standbys(servers, 2) is r0
        url = f"{r0.base}full"
        assert httpx.put(url, headers=BIN).status_code == 201
        free = shutil.disk_usage(mnt).free
        with open(mnt / "filler", "wb") as fh:
            fh.write(b"\0" * max(0, free - 2 * 1024 * 1024))
        # Writes go on past the standby's free space: r0 and r1 are a majority of 3.
        acked = b""
        for _ in range(60):
            body = uuid.uuid4().hex.encode() * 2048  # 64 KiB
            assert _post(url, body) == 204
            acked += body
        until("r2 out of the in-sync set", lambda: "r2" not in status(r0)["in_sync"])
        assert read_all(url) == acked

        # Space returns; the standby is restarted (its storage failed closed) and catches up.
        (mnt / "filler").unlink()
        small.kill()
        small.start()
        until("r2 back in sync", lambda: "r2" in status(r0)["in_sync"], timeout=90)
        assert _post(url, b"end;") == 204
        acked += b"end;"
        until("r2 to serve every acknowledged byte", lambda: read_all(f"{small.base}full") == acked)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
