"""The machine under the figures: disk sync speed, open-file limit, versions of everything."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.servers import ROOT, reference_version


def disk_syncs_per_s(workdir: Path, seconds: float = 1.0) -> float:
    """100-byte write + fdatasync, back to back, on the data directories' filesystem."""
    path = workdir / "fdatasync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        n, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            os.write(fd, b"s" * 100)
            os.fdatasync(fd)
            n += 1
        return n / elapsed
    finally:
        os.close(fd)
        path.unlink()


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def versions() -> dict[str, Any]:
    def out(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            return (p.stdout or p.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "?"

    cpu = "?"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return {
        "python": platform.python_version(),
        "node": out(["node", "--version"]),
        "wrk": out(["wrk", "-v"]),
        "reference": reference_version() or "?",
        "ours_commit": out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "kernel": platform.release(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
    }
