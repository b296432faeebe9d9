"""The figures behind docs/backup.md: how long a base backup and a restore take, in seconds
and MiB/s, for a data directory of a few hundred MiB, against a local SeaweedFS.

    python e2e/archive_figures.py [MiB] [streams]      # default 300 MiB, 2000 streams

A server with ``--archive-url`` on a fresh directory gets ``streams`` small streams
(4 KiB each) and four large ones holding the rest, written over HTTP; then
``durable-streams-server backup`` (timed: the snapshot cut into 64 MiB parts and
uploaded, the manifest last); then a tenth more written, whose WAL frames go to the
archive as frames objects (``testkit.archive_frames``, standing in for the archiver);
then ``durable-streams-server restore`` to the latest point (timed: every part
downloaded and checked, extracted and every file checked, the frames fetched and
replayed by the engine's own recovery). The restore's MiB/s counts the bytes it
downloaded. Store and server share the machine's disk and cores.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "server")]

from stream_server.archive.catalog import open_store  # noqa: E402
from testkit.archive_frames import copy_wal, run_command, upload_wal_frames  # noqa: E402
from testkit.seaweedfs import SeaweedFS  # noqa: E402
from testkit.server_process import ServerProcess  # noqa: E402

MiB = 1024 * 1024
OCTET = {"Content-Type": "application/octet-stream"}


def fill(base: str, total: int, streams: int, tag: str, each: Callable[[], object]) -> int:
    """``streams`` streams of 4 KiB and four large ones making up ``total`` bytes;
    ``each`` called after each large write."""
    written = 0
    with httpx.Client(timeout=60) as c:
        for i in range(streams):
            body = (f"{tag}{i:08d}" * 400)[:4096].encode()
            r = c.put(f"{base}small-{tag}/{i}", content=body, headers=OCTET)
            assert r.status_code == 201, r.text
            written += len(body)
        chunk = bytes(range(256)) * (4 * 1024)  # 1 MiB
        n = 0
        for j in range(4):
            assert c.put(f"{base}large-{tag}/{j}", headers=OCTET).status_code == 201
        while written < total:
            r = c.post(f"{base}large-{tag}/{n % 4}", content=chunk, headers=OCTET)
            assert r.status_code in (200, 204), r.text
            written += len(chunk)
            n += 1
            each()
    return written


def main(mib: int = 300, streams: int = 2000) -> None:
    root = Path(tempfile.mkdtemp(prefix="archive-figures-"))
    store = SeaweedFS(root / "seaweed")
    srv: ServerProcess | None = None
    try:
        store.start()
        bucket, env = store.new_bucket(), store.env()
        url = f"{bucket}/figures"
        archive = ["--archive-url", url, "--archive-endpoint", store.endpoint]
        srv = ServerProcess(root / "data", *archive, env=env).start(timeout=60)
        # The WAL copied after each write, as the archiver would have it (a checkpoint
        # deletes the old files every 64 MiB).
        data_dir = srv.data_dir

        def keep() -> Path:
            return copy_wal(data_dir, root / "wal")

        before = fill(srv.base, mib * MiB, streams, "a", keep)
        t0 = time.monotonic()
        code, backup = run_command("backup", "--server", srv.url, env=env)
        backup_s = time.monotonic() - t0
        assert code == 0, backup
        after = fill(srv.base, mib * MiB // 10, streams // 10, "b", keep)
        wal = keep()
        srv.stop()
        srv = None
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
            os.environ[key] = env[key]
        frames = upload_wal_frames(open_store(url, store.endpoint), wal, per_object=64)
        t0 = time.monotonic()
        code, restored = run_command(
            "restore", *archive, "--data-dir", str(root / "restored"), env=env
        )
        restore_s = time.monotonic() - t0
        assert code == 0, restored
        size = sum(p.stat().st_size for p in (root / "restored").rglob("*") if p.is_file())
        print(
            json.dumps(
                {
                    "written_mib": round((before + after) / MiB, 1),
                    "backup": {
                        "seconds": round(backup_s, 2),
                        "mib": round(backup["bytes"] / MiB, 1),
                        "mib_per_second": round(backup["bytes"] / MiB / backup_s, 1),
                        "parts": -(-backup["bytes"] // (64 * MiB)),
                    },
                    "frames_uploaded": len(frames),
                    "restore": {
                        "seconds": round(restore_s, 2),
                        "mib_downloaded": round(restored["bytes"] / MiB, 1),
                        "mib_per_second": round(restored["bytes"] / MiB / restore_s, 1),
                        "restored_dir_mib": round(size / MiB, 1),
                    },
                },
                indent=1,
            )
        )
    finally:
        if srv is not None:
            srv.stop()
        store.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
