"""A short run of the benchmark harness: it starts the servers and prints the table.

No timing thresholds (the machines are shared and noisy): this checks that
the harness works end to end, against the Starlette ceiling, our server and
the Node reference when it is installed (`make deps` does it; the test
itself never reaches for the network). Our server must run: the harness
exits with status 2, and this test fails, when it cannot (`import
stream_server` failing is an error, not a skip). Without the reference the
run goes on with a warning, except under `make test` (TEST_REQUIRE_ALL=1),
where the reference is required.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bench.workloads import KEYS
from testkit import needs

pytestmark = pytest.mark.processes

HERE = Path(__file__).parent
INSTALL = "make deps (Debian's nodejs and npm, then npm install in e2e/bench)"


def _reference_installed() -> bool:
    return (
        not needs.absent("node")
        and (HERE / "node_modules" / "@durable-streams" / "server" / "package.json").exists()
    )


def run_bench(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one script of the harness; a non-zero exit fails the test with its output's tail."""
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args], capture_output=True, text=True, timeout=timeout
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@needs.commands("wrk", install="Debian's wrk (make system-deps)")
@pytest.mark.timeout(240)
def test_quick_benchmark_produces_the_table(tmp_path):
    servers = ["ceiling", "ours"]
    if _reference_installed():
        servers.append("reference")
    elif needs.required():
        needs.missing(f"the Node reference server is not installed: {INSTALL}")
    else:
        warnings.warn(f"benchmark smoke test without the reference: {INSTALL}", stacklevel=1)
    out = tmp_path / "bench.json"
    # Every workload but the replicated, archived and many-streams ones, which have
    # tests of their own below.
    only = ",".join(k for k in KEYS if k != "many")
    proc = run_bench(
        "run.py",
        "--quick",
        "--duration",
        "1",  # a smoke test: the shape of the report, not the figures
        "--servers",
        ",".join(servers),
        "--only",
        only,
        "--json",
        str(out),
        timeout=220,
    )
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    assert sorted(doc["servers"]) == sorted(servers)

    # The ceiling ran, and the table says what it reached.
    assert doc["ceiling"]["appends_per_s"] > 0
    assert "HTTP ceiling" in proc.stdout
    assert "| workload" in proc.stdout

    rows = doc["rows"]
    for row in rows:
        assert row["title"] in proc.stdout
    ran = [s for s in ("ours", "reference") if s in servers]
    assert "ours" in ran
    for row in rows:
        for server in ran:
            value = row[server]
            assert isinstance(value, int | float) and math.isfinite(value) and value >= 0, row
        if "reference" in ran and row["workload"] != "appends_64x64_vs_ceiling":
            assert row["ratio"] is not None, row
        judged = row["target"] not in ("", "reported")
        if judged and ("reference" in ran or "ref" not in row["target"]):
            assert row["met"] in (True, False), row
    # Each workload produced its rows, and the servers kept every acknowledged append.
    assert {r["workload"] for r in rows} >= {
        "appends_64x64",
        "appends_64x1",
        "sequential",
        "catchup_bin",
        "catchup_json",
        "live",
        "idle",
        "restart",
    }
    for server in ran:
        for key in ("appends_64x64", "appends_64x1"):
            raw = doc["raw"][key][server]
            assert raw["errors"] == 0
            assert raw["held"] is None or raw["held"] >= raw["acknowledged"]
        assert doc["raw"]["idle"][server]["woken"] == doc["raw"]["idle"][server]["readers"]


@needs.commands("wrk", install="Debian's wrk (make system-deps)")
@pytest.mark.timeout(240)
def test_calls_per_append_are_counted_against_a_baseline():
    """calls.py runs both servers under cProfile and prints calls per append, which
    must be a plausible count (an append is a few hundred calls, never none)."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "calls.py"), "--baseline", "HEAD", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = dict(
        line.strip("|").split("|")[:2] for line in proc.stdout.splitlines() if line.count("|") == 3
    )
    ours, base = float(rows[" ours "]), float(rows[" base HEAD "])
    assert 50 < ours < 5000 and 50 < base < 5000, proc.stdout


@needs.commands("wrk", install="Debian's wrk (make system-deps)")
@pytest.mark.timeout(120)
def test_retention_benchmark_prints_both_sides_and_the_disk_over_time(tmp_path):
    """retention.py, tiny: throughput with and without a policy, their ratio, and the
    disk samples; the bounded side's largest stream must have been sampled."""
    out = tmp_path / "retention.json"
    proc = run_bench(
        "retention.py",
        *("--rounds", "1", "--seconds", "2", "--streams", "2", "--connections", "4"),
        *("--bound-kib", "64", "--json", str(out)),
        timeout=100,
    )
    assert "| none |" in proc.stdout
    assert "| bench/:max-bytes=64KiB |" in proc.stdout
    assert "| with/without |" in proc.stdout
    assert "disk use over time" in proc.stdout
    assert "largest stream under the policy" in proc.stdout
    doc = json.loads(out.read_text())
    assert math.isfinite(doc["ratio"]) and doc["ratio"] > 0
    for side in doc["sides"]:
        assert len(side["rates"]) == 1 and side["rates"][0] > 0
        assert side["errors"] == 0
        assert side["samples"][0], side  # at least one disk sample a second


@pytest.mark.timeout(120)
def test_subscriptions_benchmark_prints_latency_memory_and_scale(tmp_path):
    """subscriptions.py, tiny: every figure of issue 14's scale list comes out."""
    out = tmp_path / "subscriptions.json"
    proc = run_bench(
        "subscriptions.py",
        *("--streams", "50", "--subscriptions", "5", "--rounds", "3", "--json", str(out)),
        timeout=100,
    )
    for text in (
        "webhook wake latency",
        "memory per subscription",
        "one append waking all 5",
        "all 5 wake events",
        "matching 50 streams: PUT",
        "GET (50 streams listed)",
    ):
        assert text in proc.stdout, proc.stdout
    doc = json.loads(out.read_text())
    assert doc["wake_rounds"] == 3
    assert doc["wake_events"] == 5
    assert doc["wide_linked"] == 50
    for key in ("wake_p50_ms", "wake_p99_ms", "kib_per_subscription", "wide_put_s"):
        assert math.isfinite(doc[key]) and doc[key] >= 0, key


@needs.commands("wrk", install="Debian's wrk (make system-deps)")
@pytest.mark.timeout(120)
def test_replicated_workload_reports_both_sides_and_every_replica_holds_every_append(tmp_path):
    """The replicated workload, 1 s of load a side: the set's rows against single-node,
    the standbys' lag, and every replica byte-identical to the primary, which holds at
    least every acknowledged append."""
    out = tmp_path / "replicated.json"
    proc = run_bench(
        "run.py",
        *("--quick", "--duration", "1", "--servers", "ours", "--only", "replicated"),
        *("--json", str(out)),
        timeout=110,
    )
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    assert doc["rows"] == []  # only the replicated workload ran
    assert "replicated: 3 replicas" in proc.stdout
    assert "| workload" in proc.stdout and "repl/single" in proc.stdout
    rows = {(r["title"], r["unit"]): r for r in doc["replicated_rows"]}
    for row in rows.values():
        assert row["title"] in proc.stdout
        assert isinstance(row["ours"], int | float) and math.isfinite(row["ours"]), row
    for key in (("64 conns, 64 streams", "appends/s"), ("1 client sequential, p50", "ms")):
        row = rows[key]
        assert row["ours"] > 0 and row["reference"] > 0 and row["ratio"] > 0, row
        assert row["met"] in (True, False), row
    for title, unit in (("bytes", "bytes"), ("seconds", "s")):
        lag = rows[(f"standby lag in {title} under the appends, max", unit)]
        assert lag["ours"] >= 0 and lag["reference"] is None, lag

    single, replicated = doc["raw"]["replicated"]["single"], doc["raw"]["replicated"]["replicated"]
    assert single["replicas"] == 1 and replicated["replicas"] == 3
    for side in (single, replicated):
        assert side["errors"] == 0 and side["seq_errors"] == 0
        assert side["acknowledged"] > 0
        assert side["held"] is not None and side["held"] >= side["acknowledged"]
    assert replicated["lag_samples"] > 0
    # CPU per append, from /proc: the set's is its primary's and its standbys'.
    for cpu in ("seq_cpu_ms", "cpu_ms"):
        assert single[cpu] > 0 and single[f"{cpu}_standby"] is None
        assert replicated[f"{cpu}_primary"] > 0 and replicated[f"{cpu}_standby"] > 0
        assert replicated[cpu] == pytest.approx(
            replicated[f"{cpu}_primary"] + 2 * replicated[f"{cpu}_standby"]
        )
    # Every replica's streams equal the primary's, byte for byte, and not trivially.
    assert replicated["identical"] == 3
    assert replicated["data_bytes"] >= 100 * replicated["acknowledged"]
    assert rows[("replicas identical to the primary", "replicas")]["met"] is True


@needs.commands("wrk", install="Debian's wrk (make system-deps)")
@pytest.mark.timeout(180)
def test_archived_workload_reports_both_sides_and_the_archive_holds_every_frame(tmp_path):
    """The archived workload, 1 s of load a side, against a real SeaweedFS: the archive on
    against off, the archive's lag sampled under the load, and every frame archived."""
    out = tmp_path / "archived.json"
    proc = run_bench(
        "run.py",
        *("--quick", "--duration", "1", "--servers", "ours", "--only", "archived"),
        *("--json", str(out)),
        timeout=170,
    )
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    assert doc["rows"] == [] and doc["replicated_rows"] == []
    assert "archived: ours with the archive on" in proc.stdout and "on/off" in proc.stdout
    rows = {r["title"]: r for r in doc["archived_rows"]}
    for title in ("64 conns, 64 streams", "1 client sequential"):
        row = rows[title]
        assert row["ours"] > 0 and row["reference"] > 0 and row["ratio"] > 0, row
        assert row["met"] in (True, False), row
    assert rows["archive lag under the 64 x 64 appends, p99"]["ours"] >= 0
    assert rows["the archive holds every frame"]["met"] is True
    off, on = doc["raw"]["archived"]["off"], doc["raw"]["archived"]["on"]
    assert off["errors"] == on["errors"] == 0 and off["lag_samples"] is None
    assert on["lag_samples"] > 0 and on["archived_all"] is True


WORKERS = 2  # the worker processes of the workers workload's multi-process side


@needs.commands("wrk", install="Debian's wrk (make system-deps)")
@pytest.mark.timeout(180)
def test_workers_workload_reports_both_sides_the_model_and_the_ceilings(tmp_path):
    """The workers workload, 1 s of load a side: N workers against 1, every figure of
    both sides, the CPU of all the server's processes and of the writer, the model's
    points on 4, 8 and 16 cores, and each side's share of its own ceiling."""
    out = tmp_path / "workers.json"
    proc = run_bench(
        "run.py",
        *("--quick", "--duration", "1", "--servers", "ours", "--only", "workers"),
        *("--workers-count", str(WORKERS), "--json", str(out)),
        timeout=170,
    )
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    assert doc["rows"] == [] and doc["replicated_rows"] == [] and doc["archived_rows"] == []
    assert f"workers: ours with --workers {WORKERS} against --workers 1" in proc.stdout
    rows = {r["title"]: r for r in doc["workers_rows"]}
    alone = {title for title in rows if title.startswith("the writer alone")}
    assert len(alone) == 3  # appends/s, CPU and requests per batch: the N side's only
    for row in rows.values():
        assert row["title"] in proc.stdout
        values = (row["ours"],) if row["title"] in alone else (row["ours"], row["reference"])
        for value in values:
            assert isinstance(value, int | float) and math.isfinite(value) and value > 0, row
        if row["title"] in alone:
            assert row["reference"] is None
    for title in ("64 conns, 64 streams", "200 idle long-polls/20 streams, wake p99"):
        assert rows[title]["met"] in (True, False), rows[title]
    single, many = doc["raw"]["workers"]["single"], doc["raw"]["workers"]["workers"]
    assert single["workers"] == 1 and many["workers"] == WORKERS
    assert single["processes"] == 1 and many["processes"] >= WORKERS + (WORKERS > 1)
    for res in (single, many):
        assert res["errors"] == res["appends_1_errors"] == 0
        assert res["held"] is not None and res["held"] >= res["acknowledged"] > 0
        assert res["idle_woken"] == res["idle_readers"]
        assert 0 < res["cpu_ms_writer"] <= res["cpu_ms"]
        assert 0 < res["cpu_ms_writer_loop"] <= res["cpu_ms_writer"]  # the rest: its threads'
        assert 0 <= res["cpu_ms_writer_kernel"] <= res["cpu_ms_writer"]
        assert 1 <= res["requests_per_batch"] <= 64  # 64 connections, one request each at most
        assert res["ceiling_share_pct"] == pytest.approx(
            100 * res["appends_per_s"] / res["ceiling_appends_per_s"]
        )
    assert single["cpu_ms_writer"] == single["cpu_ms"]  # one process: the writer is all
    model = {m["cores"]: m for m in doc["workers_model"]}
    assert sorted(model) == [2, 4, 8, 16]
    for cores, m in model.items():
        assert 0 < m["amdahl_per_s"] <= m["bound_per_s"]
        assert f"| model, {cores} cores |" in proc.stdout
    assert "goal: Amdahl speedup on 8 cores >= 4x" in proc.stdout
    assert "(serial: its event loop" in proc.stdout and "; in the kernel " in proc.stdout
    # The writer fed over links alone, its holdings checked against its acknowledgements.
    assert many["writer_alone_per_s"] > 0 and single["writer_alone_per_s"] is None
    assert many["writer_alone_per_batch"] >= 1 and single["writer_alone_per_batch"] is None
    assert "measured: the writer alone carries" in proc.stdout


@pytest.mark.timeout(120)
def test_many_streams_workload_reports_every_figure_and_reads_its_streams_back(tmp_path):
    """The many-streams workload at 300 streams on ours: a figure in every row, our
    checkpoints observed (counted, not "-"), the windows and slowest appends printed,
    and a sample of the streams read back after the restart and after the kill -9
    (the workload raises, and the run exits 1, when one differs)."""
    out = tmp_path / "many.json"
    proc = run_bench(
        "run.py",
        *("--quick", "--servers", "ours", "--only", "many", "--many-streams", "300"),
        *("--json", str(out)),
        timeout=110,
    )
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    assert doc["profile"]["many_streams"] == 300
    rows = doc["rows"]
    assert len(rows) == 16 and {r["workload"] for r in rows} == {"many"}
    for row in rows:
        assert row["title"] in proc.stdout
        assert isinstance(row["ours"], int | float) and math.isfinite(row["ours"]), row
        assert row["met"] in (True, False) or row["target"] == "reported", row
    raw = doc["raw"]["many"]["ours"]
    assert raw["streams"] == 300 and raw["more_appends"] == 150
    assert raw["creates_per_s"] > 0 and raw["appends_per_s"] > 0
    assert 0 < raw["p50_ms"] <= raw["p99_ms"] <= raw["max_ms"]
    assert raw["checkpoints"] is not None and raw["slowest_in_checkpoint"] is not None
    assert 1 <= len(raw["slowest"]) <= 10  # one per stall
    assert raw["over_1s_in_checkpoint"] is not None
    assert raw["checked_streams"] >= 4  # the first, the last, both sides of the half
    assert "many streams, ours (300 streams, appends over 64 connections)" in proc.stdout
    assert "checkpoint windows (s from the first append)" in proc.stdout
    assert raw["checkpoints_in_creates"] is not None


@pytest.mark.timeout(120)
def test_gc_pauses_prints_a_line_for_each_setting():
    """gc_pauses.py at 2,000 streams: CPython's thresholds and the server's, each with
    its count of full collections and its longest pauses (the figures the server's
    GC_THRESHOLDS comment and docs/architecture.md cite)."""
    proc = run_bench("gc_pauses.py", "2000", timeout=110)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("2,000 streams")]
    assert len(lines) == 2, proc.stdout
    assert "CPython's defaults (700, 10, 10)" in lines[0]
    assert "the server's (10000, 10, 100)" in lines[1]
    for line in lines:
        assert re.search(r": \d+ full collections, longest \d+ ms; longest young [\d.]+ ms", line)
