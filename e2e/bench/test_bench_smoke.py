"""A short run of the benchmark: it starts every server and prints the table.

No timing thresholds (the machines are shared and noisy): this checks that
the harness works end to end and produces figures for each server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (make system-deps)")
@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js not installed")
def test_quick_benchmark_produces_the_table(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "run.py"),
            "--quick",
            "--only",
            "appends_64x64,live",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    rows = {r["workload"]: r for r in json.loads(out.read_text())}
    assert rows["ceiling"]["ours"]["value"] > 0
    for key in ("appends_64x64", "live"):
        assert rows[key]["ours"]["value"] > 0
        assert rows[key]["reference"]["value"] > 0
        assert rows[key]["ratio"] is not None
    assert rows["appends_64x64"]["ours"]["errors"] == 0
    assert "| 64 conns, 64 streams (appends/s)" in proc.stdout
