"""A disaster-recovery drill, as a user runs it (docs/replica-clusters.md): real server
processes, a real object store, the commands of the docs.

1. A source with ``--archive-url`` and a base backup.
2. A replica cluster started from that backup (``--archive-follow`` on the source's
   archive, its own data directory), following the source's appends and its own
   restart.
3. The source stopped for good; the replica cluster, once it holds everything the
   archive does, promoted (a start without ``--archive-follow``, with an archive
   location of its own).
4. Writes on it, a base backup of it, and restores of its archive to the latest point
   and to a time: each equal, byte for byte, to what was acknowledged.

The drill's timings (the follower's lag while following, the time to promote, the
restores' speed) are printed: ``pytest -s`` shows them (docs/replica-clusters.md has
a run's). The same follower through a failover at a replicated source is
test_dr_failover.py's.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_format.archive import rfc3339
from testkit import wait_for
from testkit.archive_follow import POLL, append, archived, archiving_source, create, follower, read
from testkit.archive_frames import run_command
from testkit.archive_reads import status
from testkit.archive_store import S3Store, server_args
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.processes

PATHS = ["orders", "events/eu", "events/us"]
BIG = 1 << 20  # each stream's first bytes


class Acked:
    """What the writer was told is durable, per stream: the drill's oracle."""

    def __init__(self) -> None:
        self.bytes: dict[str, bytes] = {}

    def create(self, srv: ServerProcess, path: str, body: bytes) -> None:
        create(srv, path, body)
        self.bytes[path] = body

    def append(self, srv: ServerProcess, path: str, body: bytes) -> None:
        append(srv, path, body)
        self.bytes[path] += body


def _serves(srv: ServerProcess, acked: Acked) -> bool:
    return all(read(srv, p)[:2] == (200, body) for p, body in acked.bytes.items())


def _restore(store: S3Store, url: str, data_dir: Path, *target: str) -> dict[str, Any]:
    where = ["--archive-url", url, "--archive-endpoint", store.endpoint]
    started = time.monotonic()
    code, out = run_command(
        "restore", *where, "--data-dir", str(data_dir), *target, env=store.env()
    )
    assert code == 0, out
    out["command_seconds"] = round(time.monotonic() - started, 2)  # the process's start too
    return out


def test_disaster_recovery_drill(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    bucket = archive_store.new_bucket()
    source_url, promoted_url = bucket + "/source", bucket + "/replica"
    acked = Acked()

    # 1. The source, archiving, with a base backup.
    src = archiving_source(server_factory, tmp_path, archive_store, source_url)
    for n, path in enumerate(PATHS):  # some MiB, so that the restores' speed means something
        acked.create(src, path, bytes([65 + n]) * BIG)
    backup = httpx.post(f"{src.url}/_archive/backups", timeout=120)
    assert backup.status_code == 201, backup.text
    archived(src)

    # 2. The replica cluster, from that backup, following appends and its own restart.
    rc = follower(server_factory, tmp_path, archive_store, source_url, name="replica")
    wait_for(lambda: _serves(rc, acked), timeout=60, message=rc.log)
    assert f"restored {source_url}" in rc.log()
    lags: list[float] = []
    for round_ in range(6):
        if round_ == 3:
            rc.stop()
            rc.start()
        for i, path in enumerate(PATHS):
            acked.append(src, path, b"round %d item %d;" % (round_, i))
        acknowledged = time.monotonic()
        wait_for(lambda: _serves(rc, acked), timeout=60, message=rc.log)
        lags.append(time.monotonic() - acknowledged)
        st = status(rc.url)
        assert st["failing"] is False and st["last_error"] is None, st
    assert "must be rebuilt" not in rc.log()

    # 3. The source gone for good; promoted once it holds everything archived.
    end = archived(src)
    src.stop()
    wait_for(
        lambda: (
            (d := status(rc.url))["applied_lsn"] == end["archived_lsn"] and d["lag_seconds"] == 0
        ),
        timeout=60,
        message=lambda: str(status(rc.url)),
    )
    promoting = time.monotonic()
    rc.stop()
    rc.args = [*server_args(archive_store, promoted_url), "--archive-timeout", POLL]
    rc.start(timeout=120)
    promote_seconds = time.monotonic() - promoting
    assert _serves(rc, acked)

    # 4. Writes on it, its own backup, more writes; restores to a time and the latest.
    for i, path in enumerate(PATHS):
        acked.append(rc, path, b"promoted item %d;" % i + bytes([97 + i]) * (BIG // 2))
    own = httpx.post(f"{rc.url}/_archive/backups", timeout=120)
    assert own.status_code == 201, own.text
    assert own.json()["term"] == 1, own.json()
    acked.append(rc, "orders", b"after its backup;")
    archived(rc)
    at_time = dict(acked.bytes)
    cut = time.time()  # every frame so far was archived (read) before it
    acked.create(rc, "late", b"after the cut;")
    acked.append(rc, "orders", b"after the cut;")
    done = archived(rc)
    assert done["last_error"] is None and done["failing"] is False, done
    rc.stop()

    latest = _restore(archive_store, promoted_url, tmp_path / "latest")
    back = server_factory(data_dir=tmp_path / "latest").start()
    assert {p: read(back, p)[1] for p in acked.bytes} == acked.bytes
    back.stop()

    to_time = _restore(
        archive_store, promoted_url, tmp_path / "at-time", "--target-time", rfc3339(cut)
    )
    back = server_factory(data_dir=tmp_path / "at-time").start()
    assert {p: read(back, p)[1] for p in at_time} == at_time
    assert read(back, "late")[0] == 404
    back.stop()

    print(
        "\nDR drill: follower lag (ack at the source -> served by the replica cluster), "
        f"{len(lags)} rounds, --archive-timeout {POLL}: median {statistics.median(lags):.2f} s, "
        f"max {max(lags):.2f} s\n"
        f"DR drill: promotion (stop the follower, start promoted, ready): {promote_seconds:.2f} s\n"
        f"DR drill: restore to the latest point: {latest['seconds']} s "
        f"({latest['command_seconds']} s the command), {latest['bytes']} bytes, "
        f"{latest['frames']} frames, {latest['mib_per_second']} MiB/s\n"
        f"DR drill: restore to a time: {to_time['seconds']} s "
        f"({to_time['command_seconds']} s the command), {to_time['bytes']} bytes, "
        f"{to_time['frames']} frames, {to_time['mib_per_second']} MiB/s"
    )
