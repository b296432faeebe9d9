"""The archive's recovery figures (issue 27 §7): restore speed and the recovery point.

    python e2e/bench/archive_recovery.py            # 1 GiB restore, RPO in both modes
    python e2e/bench/archive_recovery.py --quick    # 32 MiB, short loads (a smoke run)

Everything is real and on this machine: a SeaweedFS store (``testkit.seaweedfs``),
our server as a process with the archive on, the ``durable-streams-server``
commands a user runs.

restore: a server fills a data directory with ``--streams`` small streams (one
100-byte record each) and four large ones up to ``--size`` in all, takes a base
backup (``POST /_archive/backups``), and ``durable-streams-server restore`` builds a
new data directory from the archive; printed are the seconds and MiB/s of both, and
a spot check that the restored directory serves the same bytes.

rpo: for each archive mode, writers append to their own streams and record when
each append was acknowledged; after ``--load`` seconds the server is killed with
SIGKILL and its data directory deleted (the volumes are lost), the archive is
restored to the latest point, and a server on the restored directory is read.
Every acknowledged append that is missing counts; the recovery point is the time
from the oldest missing acknowledgement to the kill (0 when nothing is missing).
It should stay below ``--archive-timeout`` in ``async`` mode and be 0 in
``required`` mode.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the bench package and testkit
    sys.path[0:1] = [str(Path(__file__).resolve().parents[i]) for i in (1, 2)]

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import httpx

from bench.client import BIN, Conn
from bench.servers import Server
from testkit.seaweedfs import SeaweedFS

WRITERS = 8
LARGE_STREAMS = 4
CHUNK = 1024 * 1024


@dataclass
class RestoreFigures:
    streams: int
    data_mib: float
    fill_s: float
    backup_s: float
    backup_mib_per_s: float
    restore_s: float
    restore_mib_per_s: float
    spot_checked: int


@dataclass
class RpoFigures:
    mode: str
    archive_timeout_s: float
    acknowledged: int
    missing: int
    rpo_s: float


def archived_server(workdir: Path, store: SeaweedFS, url: str, *flags: str) -> Server:
    srv = Server("ours", workdir)
    srv.extra_args = ["--archive-url", url, "--archive-endpoint", store.endpoint, *flags]
    srv.extra_env = {k: v for k, v in store.env().items() if k.startswith("AWS_")}
    return srv


def restore_command(store: SeaweedFS, url: str, data_dir: Path) -> float:
    """Run ``durable-streams-server restore`` to the latest point; its seconds."""
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stream_server",
            "restore",
            "--archive-url",
            url,
            "--archive-endpoint",
            store.endpoint,
            "--data-dir",
            str(data_dir),
        ],
        env=store.env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"restore failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.monotonic() - started


def _put_all(port: int, names: list[str], body: bytes) -> None:
    c = Conn(port)
    try:
        for name in names:
            status, _, answer = c.request("PUT", f"/v1/stream/{name}", BIN, body)
            if status not in (200, 201):
                raise RuntimeError(f"PUT {name}: {status} {answer[:200]!r}")
    finally:
        c.close()


def _append_large(port: int, name: str, size: int) -> None:
    c = Conn(port)
    try:
        status, _, answer = c.request("PUT", f"/v1/stream/{name}", BIN)
        chunk = os.urandom(CHUNK)
        for _ in range(size // CHUNK):
            status, _, answer = c.request("POST", f"/v1/stream/{name}", BIN, chunk)
            if status not in (200, 204):
                raise RuntimeError(f"POST {name}: {status} {answer[:200]!r}")
    finally:
        c.close()


def _read_all(port: int, name: str) -> bytes:
    c = Conn(port)
    try:
        out = []
        offset = "-1"
        while True:
            status, headers, body = c.request(
                "GET", f"/v1/stream/{name}?offset={offset}", keep=True
            )
            if status != 200:
                raise RuntimeError(f"GET {name}: {status}")
            out.append(body)
            offset = headers["stream-next-offset"]
            if headers.get("stream-up-to-date") == "true":
                return b"".join(out)
    finally:
        c.close()


def restore_figures(workdir: Path, store: SeaweedFS, streams: int, size: int) -> RestoreFigures:
    url = store.new_bucket() + "/restore"
    srv = archived_server(workdir, store, url)
    srv.start()
    try:
        started = time.monotonic()
        names = [f"small-{i}" for i in range(streams)]
        shards = [names[i::WRITERS] for i in range(WRITERS)]
        large = [f"large-{i}" for i in range(LARGE_STREAMS)]
        small_bytes = 100 * streams
        per_large = max(CHUNK, (size - small_bytes) // LARGE_STREAMS // CHUNK * CHUNK)
        with ThreadPoolExecutor(WRITERS + LARGE_STREAMS) as pool:
            jobs = [pool.submit(_put_all, srv.port, shard, b"r" * 100) for shard in shards]
            jobs += [pool.submit(_append_large, srv.port, n, per_large) for n in large]
            for job in jobs:
                job.result()
        fill = time.monotonic() - started
        data_mib = (small_bytes + per_large * LARGE_STREAMS) / 2**20
        started = time.monotonic()
        answer = httpx.post(f"http://127.0.0.1:{srv.port}/_archive/backups", timeout=3600)
        answer.raise_for_status()
        backup = time.monotonic() - started
        expected = {n: _read_all(srv.port, n) for n in [*large, names[0], names[-1]]}
    finally:
        srv.cleanup()
    target = workdir / "restored"
    restore = restore_command(store, url, target)
    check = Server("ours", workdir)
    check.start(data_dir=target)
    try:
        for name, data in expected.items():
            if _read_all(check.port, name) != data:
                raise RuntimeError(f"the restored {name} differs from the source")
    finally:
        check.cleanup()
    return RestoreFigures(
        streams=streams + LARGE_STREAMS,
        data_mib=round(data_mib, 1),
        fill_s=round(fill, 2),
        backup_s=round(backup, 2),
        backup_mib_per_s=round(data_mib / backup, 1),
        restore_s=round(restore, 2),
        restore_mib_per_s=round(data_mib / restore, 1),
        spot_checked=len(expected),
    )


class Writer(threading.Thread):
    """Appends numbered 16-byte records to its own stream, one at a time, and records
    the time of each acknowledgement."""

    def __init__(self, port: int, name: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.name, self.stop = port, name, stop
        self.acked: list[float] = []  # acked[i]: when record i was acknowledged

    def run(self) -> None:
        c = Conn(self.port, timeout=30)
        try:
            while not self.stop.is_set():
                body = f"{len(self.acked):015d}\n".encode()
                status, _, _ = c.request("POST", f"/v1/stream/{self.name}", BIN, body)
                if status not in (200, 204):
                    return
                self.acked.append(time.time())
        except OSError:
            return  # the server was killed
        finally:
            c.close()


def rpo_figures(
    workdir: Path, store: SeaweedFS, mode: str, load: float, archive_timeout: float
) -> RpoFigures:
    url = store.new_bucket() + "/rpo"
    srv = archived_server(
        workdir, store, url, "--archive-mode", mode, "--archive-timeout", str(archive_timeout)
    )
    srv.start()
    names = [f"w-{i}" for i in range(WRITERS)]
    _put_all(srv.port, names, b"")
    answer = httpx.post(f"http://127.0.0.1:{srv.port}/_archive/backups", timeout=600)
    answer.raise_for_status()
    stop = threading.Event()
    writers = [Writer(srv.port, n, stop) for n in names]
    for w in writers:
        w.start()
    time.sleep(load)  # the load's length: what is measured is what happens at its end
    assert srv.child is not None and srv.child.proc is not None
    os.kill(srv.child.proc.pid, signal.SIGKILL)
    killed = time.time()
    stop.set()
    for w in writers:
        w.join()
    srv.child.proc.wait()
    assert srv.data_dir is not None
    shutil.rmtree(srv.data_dir)  # the volumes are lost
    target = workdir / f"rpo-{mode}"
    restore_command(store, url, target)
    check = Server("ours", workdir)
    check.start(data_dir=target)
    missing_since: list[float] = []
    missing = 0
    try:
        for w in writers:
            held = len(_read_all(check.port, w.name)) // 16
            if held < len(w.acked):
                missing += len(w.acked) - held
                missing_since.append(w.acked[held])
    finally:
        check.cleanup()
    return RpoFigures(
        mode=mode,
        archive_timeout_s=archive_timeout,
        acknowledged=sum(len(w.acked) for w in writers),
        missing=missing,
        rpo_s=round(killed - min(missing_since), 3) if missing_since else 0.0,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="32 MiB and short loads (a smoke run)")
    ap.add_argument("--streams", type=int, default=None, help="small streams (100,000)")
    ap.add_argument("--size", type=int, default=None, help="bytes in all (1 GiB)")
    ap.add_argument("--load", type=float, default=None, help="seconds of appends (25)")
    ap.add_argument("--archive-timeout", type=float, default=10.0)
    ap.add_argument("--only", default="restore,rpo", help="restore, rpo or both")
    ap.add_argument("--json", dest="json_out", help="also write the figures to this file")
    args = ap.parse_args(argv)
    streams = args.streams or (2000 if args.quick else 100_000)
    size = args.size or (32 if args.quick else 1024) * 2**20
    load = args.load or (3.0 if args.quick else 25.0)
    only = {x.strip() for x in args.only.split(",")}
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="ds-archive-bench-") as tmp:
        workdir = Path(tmp)
        store = SeaweedFS(workdir / "seaweedfs")
        store.start()
        try:
            if "restore" in only:
                r = restore_figures(workdir, store, streams, size)
                out["restore"] = asdict(r)
                print(
                    f"restore: {r.streams:,} streams, {r.data_mib:,.1f} MiB: backup "
                    f"{r.backup_s:.1f} s ({r.backup_mib_per_s:.1f} MiB/s), restore "
                    f"{r.restore_s:.1f} s ({r.restore_mib_per_s:.1f} MiB/s); fill {r.fill_s:.1f} s"
                )
            if "rpo" in only:
                for mode in ("async", "required"):
                    p = rpo_figures(workdir, store, mode, load, args.archive_timeout)
                    out[f"rpo_{mode}"] = asdict(p)
                    print(
                        f"rpo ({mode}, --archive-timeout {p.archive_timeout_s:g} s): "
                        f"{p.acknowledged:,} acknowledged, {p.missing:,} missing after a "
                        f"restore to the latest point: {p.rpo_s:.2f} s of writes lost"
                    )
        finally:
            store.close()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
