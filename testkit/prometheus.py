"""A real Prometheus for the tests, and the dashboard's and alert rules' queries to put to it.

``Prometheus`` runs the ``prometheus`` program on a free port with the
project's alert rules loaded, scraping the targets (or a PodMonitor's jobs)
given; ``panel_queries`` reads the Grafana dashboard's queries with its
variables set. Shared by the tests under tests/observability that scrape
real servers (a single server, a replica set, pods found by a PodMonitor).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from testkit.servers import free_port

OBS = Path(__file__).resolve().parents[1] / "observability"
DASHBOARD = OBS / "grafana" / "durable-streams.json"
ALERTS = OBS / "prometheus" / "alerts.yaml"
ALL = {"namespace": ".*", "pod": ".*", "instance": ".*"}
RATE_INTERVAL = "15s"  # what Grafana would pick for a 1 s scrape interval and a short range
DEADLINE = 60.0  # seconds to wait for Prometheus to see everything; normally 10-20


def substitute(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in values.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, expr
    return expr


def panel_queries(values: dict[str, str] = ALL, rows: str = "single") -> list[tuple[str, str]]:
    """(title, query) of the panels in the replica-set rows (``rows="replication"``),
    the archive's row (``"archive"``: only a server with an object-store archive has
    its series), the others (``"single"``: a single server without an archive) or all."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    row = ""
    for p in dash["panels"]:
        if p["type"] == "row":
            row = p["title"]
            continue
        kind = "replication" if row.startswith("Replication") else "single"
        kind = "archive" if row == "Archive" else kind
        if rows in ("all", kind):
            out.extend((p["title"], substitute(t["expr"], values)) for t in p["targets"])
    return out


def variables() -> dict[str, str]:
    dash = json.loads(DASHBOARD.read_text())
    return {
        v["name"]: v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"
    }


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


class Prometheus:
    def __init__(
        self,
        tmp_path: Path,
        targets: list[tuple[str, dict]],
        scrape_configs: list[dict] | None = None,
    ) -> None:
        """Scrapes ``targets`` as one static job, or the jobs ``scrape_configs`` give
        (a PodMonitor's, as the Prometheus Operator writes them)."""
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}/api/v1"
        self.log_path = tmp_path / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                *(
                    scrape_configs
                    or [
                        {
                            # A job named after the DurableStream (a Service's name), not
                            # after the application: what the alerts' up rule also covers.
                            "job_name": "orders",
                            "static_configs": [
                                {"targets": [address], "labels": labels}
                                for address, labels in targets
                            ],
                        }
                    ]
                ),
                {
                    "job_name": "prometheus",
                    "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}],
                },
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        """Until Prometheus answers ``/-/ready``: on a loaded machine it may take seconds to
        open its port, and a query before that is refused (not an answer to wait on)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/-/ready", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready after {timeout} s: {self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def get(self, path: str, **params) -> dict | list:
        r = httpx.get(f"{self.api}/{path}", params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.get("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def values(self, expr: str) -> list[float]:
        return [float(s["value"][1]) for s in self.query(expr)]

    def label_values(self, query: str) -> list[str]:
        """Grafana's label_values(selector, label), through the series API."""
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert m, query
        series = self.get("series", **{"match[]": m.group(1)})
        return sorted({s[m.group(2)] for s in series if m.group(2) in s})

    def alerts(self) -> list[dict]:
        return self.get("alerts")["alerts"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def until_no_problems(what: str, check, prom: Prometheus, errors: list[Exception]) -> None:
    """Poll until check() returns no problems; fail with the last ones, or at
    once if a traffic thread failed."""
    deadline = time.monotonic() + DEADLINE
    problems = ["not checked yet"]
    while time.monotonic() < deadline:
        assert not errors, f"traffic failed: {errors!r}"
        try:
            problems = check()
        except (httpx.HTTPError, AssertionError, ValueError) as exc:
            problems = [repr(exc)]
        if not problems:
            return
        time.sleep(0.5)
    pytest.fail(f"{what}: {problems}\n--- prometheus log ---\n{prom.log()}")


def background(errors: list[Exception], body: Callable[[], object]) -> threading.Thread:
    """``body`` in a daemon thread; an exception it raises goes to ``errors`` (which
    ``until_no_problems`` checks), not lost in the thread."""

    def loop() -> None:
        try:
            body()
        except Exception as exc:  # reported by the test, not lost in a thread
            errors.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread
