"""Builds grafana/durable-streams.json from the panel list below.

The dashboard is data, but writing its JSON by hand invites drift: the rows
and queries live here, and ``python observability/build_dashboard.py``
regenerates the file (a test checks that the committed copy is current).
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).parent / "grafana" / "durable-streams.json"
SEL = 'namespace=~"$namespace", pod=~"$pod"'
P = "durable_streams"


def q(expr: str, legend: str = "") -> dict:
    return {"expr": expr, "legendFormat": legend}


def quantiles(metric: str, by: str = "") -> list[dict]:
    group = f"le{', ' + by if by else ''}"
    return [
        q(
            f"histogram_quantile({p}, sum by ({group}) (rate({P}_{metric}_bucket{{{SEL}}}[$__rate_interval])))",
            f"p{int(p * 100)}{' {{' + by + '}}' if by else ''}",
        )
        for p in (0.5, 0.95, 0.99)
    ]


def rate(metric: str, legend: str, by: str = "") -> dict:
    inner = f"rate({P}_{metric}{{{SEL}}}[$__rate_interval])"
    return q(f"sum by ({by}) ({inner})" if by else f"sum({inner})", legend)


ROWS: list[tuple[str, list[tuple[str, str, str, list[dict]]]]] = [
    (
        "Overview",
        [
            ("stat", "Ready pods", "none", [q(f"sum({P}_ready{{{SEL}}})", "ready")]),
            ("stat", "Streams", "none", [q(f"sum({P}_streams{{{SEL}}})", "streams")]),
            ("stat", "Appends / s", "ops", [rate("appends_total", "appends/s")]),
            ("stat", "Live readers", "none", [q(f"sum({P}_live_readers{{{SEL}}})", "readers")]),
            (
                "stat",
                "Storage failed closed",
                "none",
                [q(f"max({P}_storage_failed{{{SEL}}})", "failed")],
            ),
        ],
    ),
    (
        "Durable append latency",
        [
            (
                "timeseries",
                "Append latency (request received to durable)",
                "s",
                quantiles("append_duration_seconds"),
            ),
            ("timeseries", "WAL fsync latency", "s", quantiles("fsync_duration_seconds")),
            (
                "timeseries",
                "LMDB metadata commit latency",
                "s",
                quantiles("metadata_commit_duration_seconds"),
            ),
            (
                "timeseries",
                "Segment write latency",
                "s",
                quantiles("segment_write_duration_seconds"),
            ),
        ],
    ),
    (
        "Throughput",
        [
            ("timeseries", "Appends / s", "ops", [rate("appends_total", "appends")]),
            (
                "timeseries",
                "Bytes / s",
                "Bps",
                [rate("appended_bytes_total", "appended"), rate("read_bytes_total", "read")],
            ),
            (
                "timeseries",
                "Requests / s by code",
                "reqps",
                [rate("http_requests_total", "{{method}} {{code}}", "method, code")],
            ),
            (
                "timeseries",
                "Request latency p99 by method",
                "s",
                [
                    q(
                        f"histogram_quantile(0.99, sum by (le, method) (rate({P}_http_request_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                        "{{method}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Group commit",
        [
            ("timeseries", "Appends per batch", "none", quantiles("batch_appends")),
            ("timeseries", "Requests per batch", "none", quantiles("batch_requests")),
            ("timeseries", "Bytes per batch", "bytes", quantiles("batch_bytes")),
            ("timeseries", "Batches / s", "ops", [rate("batches_total", "batches")]),
        ],
    ),
    (
        "Streams and readers",
        [
            (
                "timeseries",
                "Live readers by mode",
                "none",
                [q(f"sum by (mode) ({P}_live_readers{{{SEL}}})", "{{mode}}")],
            ),
            ("timeseries", "Streams", "none", [q(f"sum({P}_streams{{{SEL}}})", "streams")]),
            (
                "timeseries",
                "Created, forked, deleted / s",
                "ops",
                [
                    rate("streams_created_total", "created"),
                    rate("forks_created_total", "forks"),
                    rate("streams_deleted_total", "{{reason}}", "reason"),
                ],
            ),
            (
                "timeseries",
                "Producer duplicates, fencing, gaps / s",
                "ops",
                [rate("producer_events_total", "{{event}}", "event")],
            ),
        ],
    ),
    (
        "Errors",
        [
            (
                "timeseries",
                "4xx and 5xx / s",
                "reqps",
                [
                    q(
                        f'sum(rate({P}_http_requests_total{{{SEL}, code=~"4.."}}[$__rate_interval])) or vector(0)',
                        "4xx",
                    ),
                    q(
                        f'sum(rate({P}_http_requests_total{{{SEL}, code=~"5.."}}[$__rate_interval])) or vector(0)',
                        "5xx",
                    ),
                ],
            ),
            (
                "timeseries",
                "Batch failures / s",
                "ops",
                [rate("batch_failures_total", "{{reason}}", "reason")],
            ),
            ("timeseries", "Slow appends / s", "ops", [rate("slow_appends_total", "slow")]),
        ],
    ),
    (
        "Disk",
        [
            (
                "timeseries",
                "Bytes on disk by part",
                "bytes",
                [q(f"sum by (part) ({P}_disk_bytes{{{SEL}}})", "{{part}}")],
            ),
            (
                "timeseries",
                "Free space ratio",
                "percentunit",
                [q(f"min({P}_disk_free_bytes{{{SEL}}} / {P}_disk_total_bytes{{{SEL}}})", "free")],
            ),
        ],
    ),
    (
        "Recovery",
        [
            (
                "stat",
                "Recovery duration at start",
                "s",
                [q(f"max({P}_recovery_duration_seconds{{{SEL}}})", "seconds")],
            ),
            (
                "stat",
                "Streams recovered",
                "none",
                [q(f"sum({P}_recovery_streams{{{SEL}}})", "streams")],
            ),
            (
                "stat",
                "WAL frames replayed",
                "none",
                [q(f"sum({P}_recovery_wal_frames{{{SEL}}})", "frames")],
            ),
        ],
    ),
    (
        "Process",
        [
            (
                "timeseries",
                "Resident memory",
                "bytes",
                [q(f"sum by (pod) (process_resident_memory_bytes{{{SEL}}})", "{{pod}}")],
            ),
            (
                "timeseries",
                "CPU",
                "percentunit",
                [
                    q(
                        f"sum by (pod) (rate(process_cpu_seconds_total{{{SEL}}}[$__rate_interval]))",
                        "{{pod}}",
                    )
                ],
            ),
            (
                "timeseries",
                "Open file descriptors",
                "none",
                [q(f"sum by (pod) (process_open_fds{{{SEL}}})", "{{pod}}")],
            ),
        ],
    ),
]


def build() -> dict:
    panels = []
    pid = 1
    y = 0
    for title, row in ROWS:
        panels.append(
            {
                "type": "row",
                "id": pid,
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid += 1
        y += 1
        width = 24 // len(row)
        for i, (kind, ptitle, unit, targets) in enumerate(row):
            panel = {
                "type": kind,
                "id": pid,
                "title": ptitle,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 4 if kind == "stat" else 8, "w": width, "x": i * width, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {},
                "targets": [
                    {
                        "refId": chr(65 + j),
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        **t,
                    }
                    for j, t in enumerate(targets)
                ],
            }
            if kind == "timeseries":
                panel["options"] = {
                    "legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"},
                }
            panels.append(panel)
            pid += 1
        y += 4 if all(k == "stat" for k, *_ in row) else 8
    variables = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
        {
            "name": "namespace",
            "type": "query",
            "label": "Namespace",
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "refresh": 2,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": f"label_values({P}_ready, namespace)", "refId": "ns"},
        },
        {
            "name": "pod",
            "type": "query",
            "label": "Pod",
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "refresh": 2,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {
                "query": f'label_values({P}_ready{{namespace=~"$namespace"}}, pod)',
                "refId": "pod",
            },
        },
    ]
    return {
        "uid": "durable-streams",
        "title": "Durable Streams",
        "tags": ["durable-streams"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
