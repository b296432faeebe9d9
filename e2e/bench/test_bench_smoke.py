"""A short run of the benchmark harness: it starts the servers and prints the table.

No timing thresholds (the machines are shared and noisy): this checks that
the harness works end to end, against the Starlette ceiling, our server
(unless `import stream_server` fails, which the harness reports as a skip)
and the Node reference when it is already installed (`make deps` does it;
the test itself never reaches for the network).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _reference_installed() -> bool:
    return (
        shutil.which("node") is not None
        and (HERE / "node_modules" / "@durable-streams" / "server" / "package.json").exists()
    )


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (make system-deps)")
@pytest.mark.timeout(240)
def test_quick_benchmark_produces_the_table(tmp_path):
    servers = ["ceiling", "ours"] + (["reference"] if _reference_installed() else [])
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "run.py"),
            "--quick",
            "--servers",
            ",".join(servers),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=220,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}

    # The ceiling ran, and the table says what it reached.
    assert doc["ceiling"]["appends_per_s"] > 0
    assert "HTTP ceiling" in proc.stdout
    assert "| workload" in proc.stdout

    rows = doc["rows"]
    titles = [r["title"] for r in rows]
    for title in titles:
        assert title in proc.stdout
    ran = [s for s in ("ours", "reference") if s in servers and s not in doc["skipped"]]
    if "ours" not in ran:
        assert "import stream_server failed" in doc["skipped"]["ours"]
    for row in rows:
        for server in ran:
            value = row[server]
            assert isinstance(value, int | float) and math.isfinite(value) and value >= 0, row
        if {"ours", "reference"} <= set(ran) and row["workload"] != "appends_64x64_vs_ceiling":
            assert row["ratio"] is not None, row
        if "ours" in ran and row["target"] not in ("", "reported"):
            assert row["met"] in (True, False), row
    # Each workload produced its rows, and the servers kept every acknowledged append.
    assert {r["workload"] for r in rows} >= (
        {
            "appends_64x64",
            "appends_64x1",
            "sequential",
            "catchup_bin",
            "catchup_json",
            "live",
            "idle",
            "restart",
        }
        if ran
        else set()
    )
    for server in ran:
        for key in ("appends_64x64", "appends_64x1"):
            raw = doc["raw"][key][server]
            assert raw["errors"] == 0
            assert raw["held"] is None or raw["held"] >= raw["acknowledged"]
        assert doc["raw"]["idle"][server]["woken"] == doc["raw"]["idle"][server]["readers"]
