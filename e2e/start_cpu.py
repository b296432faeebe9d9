"""The CPU a server's start costs, from the process's launch to uvicorn's "started".

    python e2e/start_cpu.py [--runs 8] [-- further serve flags]

starts the server on an empty data directory ``--runs`` times, one after another, and
prints the min and median of the CPU seconds each process had used once it was serving
(its own utime and stime from /proc, read 0.3 s after uvicorn's line, so that the
start's last steps are in). Every test that starts a server pays this, so the suite's
CPU moves with it; the median of several runs is the figure, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
STARTED = "Started server process"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a running process (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one_start(flags: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "stream_server", "serve", "--data-dir", f"{tmp}/data"]
        argv += ["--port", "0", "--workers", "1", *flags]
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if STARTED in line:
                    break
            else:
                raise SystemExit(f"the server exited before serving (status {proc.wait()})")
            time.sleep(0.3)
            return cpu_seconds(proc.pid)
        finally:
            proc.terminate()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("flags", nargs="*", help="further serve flags, after --")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    figures = sorted(one_start(args.flags) for _ in range(args.runs))
    print(
        f"server start to serving: {args.runs} runs, CPU min {figures[0]:.2f} s, "
        f"median {statistics.median(figures):.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
