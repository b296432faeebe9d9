"""The figures behind "Sizing" in docs/kubernetes.md: memory and inodes against streams.

    python e2e/sizing_figures.py 10000 100000

For each count N: a fresh data directory, N streams created over HTTP (each
with a 100-byte first message, as ``PUT`` with a body), the server stopped
and started again; printed are the time to ready, the resident memory once
ready and its peak during the start (VmHWM: what a memory limit must hold),
and the files (inodes) the data directory uses. The stop is timed too: a
clean stop ends with a checkpoint that flushes every segment file written
since the last one, one fdatasync per stream.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "e2e"), str(ROOT / "server")]

from bench.client import fill, request_bytes  # noqa: E402
from testkit.servers import Child, free_port, http_status, rss_bytes, stream_server_command  # noqa: E402

MiB = 1024 * 1024
BODY = b"x" * 100


@dataclass
class Server:
    """What the benchmark's ``fill`` needs of a server."""

    child: Child
    port: int
    kind: str = "ours"

    @property
    def running(self) -> bool:
        return self.child.running

    def log_tail(self) -> str:
        return self.child.log_tail()


def peak_rss(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else 0


def files(path: Path) -> int:
    return sum(len(names) + len(dirs) for _, dirs, names in os.walk(path))


def start(data: Path, port: int, log: Path) -> tuple[Child, float]:
    child = Child("server", stream_server_command(port, data), log)
    seconds = child.start(lambda: http_status(port, "/readyz", timeout=1) == 200, timeout=900)
    return child, seconds


def measure(n: int, work: Path) -> None:
    data, port = work / f"data-{n}", free_port()
    child, _ = start(data, port, work / f"fill-{n}.log")
    started = time.monotonic()
    puts = (
        request_bytes("PUT", f"/v1/stream/s/{i}", {"Content-Type": "text/plain"}, BODY)
        for i in range(n)
    )
    done = fill(Server(child, port), puts, 32)
    if done.ok != n:
        raise RuntimeError(f"{done.ok} of {n} streams created: {done.bad}")
    fill_s = time.monotonic() - started
    assert child.proc is not None
    rss_filled = rss_bytes(child.proc.pid)
    stopping = time.monotonic()
    child.stop(timeout=900)  # never killed: the next start must not replay a WAL
    stop_s = time.monotonic() - stopping
    child, ready_s = start(data, port, work / f"restart-{n}.log")
    assert child.proc is not None
    rss_ready, peak = rss_bytes(child.proc.pid), peak_rss(child.proc.pid)
    child.stop()
    print(
        f"{n:>7} streams: filled in {fill_s:.0f} s (RSS {rss_filled / MiB:.0f} MiB), "
        f"stopped in {stop_s:.1f} s; "
        f"restart ready in {ready_s:.1f} s, RSS {rss_ready / MiB:.0f} MiB, "
        f"peak {peak / MiB:.0f} MiB; {files(data)} files and directories",
        flush=True,
    )


def main(argv: list[str]) -> int:
    counts = [int(a) for a in argv] or [10_000, 100_000]
    with tempfile.TemporaryDirectory(prefix="ds-sizing-") as tmp:
        work = Path(tmp)
        child, _ = start(work / "empty", free_port(), work / "empty.log")
        assert child.proc is not None
        print(f"      0 streams: RSS {rss_bytes(child.proc.pid) / MiB:.0f} MiB", flush=True)
        child.stop()
        for n in counts:
            measure(n, work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
