"""The Grafana dashboard's JSON: generated from its source, well formed, and
covering every metric the server exposes (no Grafana needed; the queries run
against a real Prometheus in test_prometheus.py)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from stream_server.archive.archive_metrics import ArchiveCollector
from stream_server.archive.progress import ArchiveProgress
from stream_server.metrics import Metrics
from stream_server.replication.replica_metrics import ReplicationCollector

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "observability"
DOCS = ROOT / "docs" / "observability.md"
DASHBOARD = OBS / "grafana" / "durable-streams.json"
VARIABLES = ("namespace", "pod", "instance")
# A metric name and its optional {matchers}, outside of label_values() strings.
SELECTOR = re.compile(r"\b((?:durable_streams|process)_[a-z_]+)\b(\{[^}]*\})?")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def test_json_is_generated_from_its_source():
    spec = importlib.util.spec_from_file_location("build_dashboard", OBS / "build_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DASHBOARD.read_text() == module.render(), "run: python observability/build_dashboard.py"


def test_modern_self_contained_dashboard():
    dash = dashboard()
    assert dash["schemaVersion"] == 39
    assert dash["uid"] == "durable-streams" and dash["id"] is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in VARIABLES:
        v = variables[name]
        assert v["type"] == "query" and v["includeAll"] and v["allValue"] == ".*", name
        assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert v["query"]["query"].startswith("label_values(durable_streams_ready")
        assert v["query"]["query"].endswith(f", {name})")
    # Nothing refers to a data source by a name or uid that exists only somewhere else.
    assert "__inputs" not in dash
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["type"] in ("timeseries", "stat"), p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs), p["title"]


def test_ids_unique_and_grid_without_overlap():
    all_panels = dashboard()["panels"]
    ids = [p["id"] for p in all_panels]
    assert len(set(ids)) == len(ids)
    cells: dict[tuple[int, int], str] = {}
    for p in all_panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_rows_in_order():
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Append and fsync latency",
        "Segment write and metadata commit latency",
        "Throughput",
        "Group commit",
        "Readers and streams",
        "Errors",
        "Disk",
        "Recovery (at the last start)",
        "Subscriptions",
        "Retention",
        "Replication",
        "Replication lag and shipping",
        "Archive",
        "Process",
    ]


def test_every_selector_is_filtered_by_every_variable():
    for expr in exprs():
        for metric, matchers in SELECTOR.findall(expr):
            for var in VARIABLES:
                assert f'{var}=~"${var}"' in matchers, f"{metric} without ${var} in: {expr}"


def primary_of_three() -> Any:
    """Stand-in for the state ReplicationCollector reads: the primary of a set of
    three, one standby caught up, one a frame behind. Only the values are made up;
    the collector and its names are the server's."""
    state = SimpleNamespace(term=2, in_sync=["ds-1"])
    shipper = SimpleNamespace(
        shipped=7,
        lsn=6,
        acked={"ds-1": (2, 6), "ds-2": (2, 5)},
        ring=[(2, 6, b"frame")],
        caught_up_at={"ds-1": 0.0, "ds-2": 0.0},
    )
    return SimpleNamespace(
        shipper=shipper,
        primary_mode=True,
        roles=SimpleNamespace(state=state),
        quorum=2,
        degraded=False,
        hooks=SimpleNamespace(durable=(2, 6)),
        failovers=1,
        read_fence=SimpleNamespace(fresh_for=lambda: 1.5),
    )


def exposed(data_dir: Path) -> tuple[set[str], set[str]]:
    """Metric families and sample names of a server's registry, every labelled
    series created (as a running server has them after its first request), and
    the replication and archive series registered as app.py does in a replica set with an
    archive."""
    m = Metrics()
    m.bind(
        streams=lambda: 0,
        live=lambda mode: 0,
        data_dir=str(data_dir),
        segment_bytes=lambda: 0,
        ready=lambda: True,
        failed=lambda: False,
    )
    m.bind_retention(reclaimed=lambda: 0, policies=lambda: {"logs/": (0, 0.0)})
    m.on_request("GET", 200, 0.001)
    m.registry.register(ReplicationCollector(cast(Any, primary_of_three())))
    # and the archive's, as app.py registers them with --archive-url
    m.registry.register(ArchiveCollector(ArchiveProgress("s3://bucket", "async"), 10.0))
    collected = list(m.registry.collect())
    return {f.name for f in collected}, {s.name for f in collected for s in f.samples}


def test_every_server_metric_is_on_the_dashboard_and_every_query_names_one(tmp_path):
    families, samples = exposed(tmp_path)
    used = {name for expr in exprs() for name, _ in SELECTOR.findall(expr)}
    ours = {f for f in families if f.startswith("durable_streams_")}
    suffixes = ("", "_total", "_bucket", "_count", "_sum")
    missing = {f for f in ours if not any(f + suffix in used for suffix in suffixes)}
    assert not missing, f"metrics with no panel: {sorted(missing)}"
    unknown = sorted(used - samples)
    assert not unknown, f"queries name metrics the server does not expose: {unknown}"


def test_docs_list_every_metric(tmp_path):
    families, samples = exposed(tmp_path)
    docs = DOCS.read_text()
    for family in sorted(families):
        name = f"{family}_total" if f"{family}_total" in samples else family
        assert f"`{name.removeprefix('durable_streams_')}`" in docs, f"{name} not in {DOCS}"
