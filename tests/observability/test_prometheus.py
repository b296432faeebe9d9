"""The dashboard and the alerts against a real Prometheus scraping a real server.

Every query of every dashboard panel and every alert expression runs through
Prometheus's HTTP API without error; panel queries return data once traffic
has flowed. ``promtool`` checks and unit-tests the alert rules.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "observability"
DASHBOARD = OBS / "grafana" / "durable-streams.json"
ALERTS = OBS / "prometheus" / "alerts.yaml"

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Debian's prometheus package is not installed (make system-deps installs it)",
)


def test_dashboard_json_is_generated_from_its_source():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_dashboard", OBS / "build_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DASHBOARD.read_text() == module.render(), "run python observability/build_dashboard.py"


def panel_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = (
                target["expr"]
                .replace("$__rate_interval", "20s")
                .replace("$namespace", ".*")
                .replace("$pod", ".*")
            )
            out.append((panel["title"], expr))
    return out


def alert_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


@needs_prometheus
def test_promtool_checks_and_unit_tests_the_rules():
    subprocess.run(["promtool", "check", "rules", str(ALERTS)], check=True, capture_output=True)
    test = subprocess.run(
        ["promtool", "test", "rules", "alerts.test.yaml"],
        cwd=ALERTS.parent,
        capture_output=True,
        text=True,
    )
    assert test.returncode == 0, test.stdout + test.stderr


def _traffic(srv, stop: threading.Event) -> None:
    ct = {"Content-Type": "application/octet-stream"}
    with httpx.Client(timeout=10) as c:
        url = f"{srv.base}obs/{uuid.uuid4().hex}"
        c.put(url, headers=ct)
        c.put(
            f"{srv.base}obs/fork-{uuid.uuid4().hex}",
            headers={"Stream-Forked-From": url.split(srv.url, 1)[1]},
        )
        seq = 0
        while not stop.is_set():
            c.post(url, headers=ct, content=b"x" * 100)
            p = {"Producer-Id": "obs", "Producer-Epoch": "0", "Producer-Seq": str(seq)}
            c.post(url, headers=ct | p, content=b"p")
            c.post(url, headers=ct | p, content=b"p")  # duplicate
            seq += 1
            c.get(url, params={"offset": "-1"})
            c.post(url, headers={"Content-Type": "text/plain"}, content=b"bad")  # 409
            c.get(url, params={"offset": "now", "live": "long-poll"}, timeout=5)
            time.sleep(0.05)


@needs_prometheus
def test_real_prometheus_scrapes_and_every_query_answers(server_factory, tmp_path):
    srv = server_factory("--long-poll-timeout", "0.2").start()
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(srv, stop), daemon=True)
    traffic.start()
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "durable-streams",
                "static_configs": [{"targets": [f"127.0.0.1:{srv.port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(expr: str) -> list:
        r = httpx.get(f"{api}/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if query("sum(rate(durable_streams_appends_total[20s])) > 0"):
                    break
            except (httpx.HTTPError, AssertionError, ValueError):
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never saw traffic: " + prom.stderr.read1(4000).decode())
        time.sleep(3)  # a few more scrapes, so every rate has two samples in its window
        empty = [(title, expr) for title, expr in panel_queries() if not query(expr)]
        assert not empty, f"panels without data: {empty}"
        for _name, expr in alert_exprs():
            query(expr)  # no error; firing or not is promtool's business
        rules = httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
        loaded = [r for g in rules for r in g["rules"]]
        assert len(loaded) == len(alert_exprs())
        assert all(r["health"] == "ok" for r in loaded), loaded
    finally:
        stop.set()
        prom.terminate()
        prom.wait(10)
        traffic.join(10)
