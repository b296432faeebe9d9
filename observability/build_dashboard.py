"""Builds grafana/durable-streams.json from the rows and panels below.

The dashboard is data, but writing its JSON by hand invites drift: the rows
and queries live here, and ``python observability/build_dashboard.py``
regenerates the file (a test checks that the committed copy is current).

Every metric selector carries ``SEL``, so the namespace, pod and instance
variables filter every panel. Outside Kubernetes the targets have no
namespace or pod label; the variables' "All" value ``.*`` also matches an
absent label.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).parent / "grafana" / "durable-streams.json"
P = "durable_streams"
SEL = 'namespace=~"$namespace", pod=~"$pod", instance=~"$instance"'
RATE = "$__rate_interval"
TARGET = "namespace, pod, instance"  # one series per scraped server
TARGET_LEGEND = "{{pod}} {{instance}}"
SET = "namespace, job"  # one replica set: the pods behind one Service
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
CODE_4XX = 'code=~"4.."'
CODE_5XX = 'code=~"5.."'
ARCHIVE = "durable_streams_archive"  # the archive's metrics (server/stream_server/archive/)


def q(expr: str, legend: str = "") -> dict:
    return {"expr": expr, "legendFormat": legend}


def sel(metric: str, extra: str = "") -> str:
    return f"{metric}{{{SEL}{', ' + extra if extra else ''}}}"


def rate(metric: str, legend: str, by: str = "", extra: str = "") -> dict:
    inner = f"rate({sel(f'{P}_{metric}', extra)}[{RATE}])"
    return q(f"sum by ({by}) ({inner})" if by else f"sum({inner})", legend)


def quantiles(metric: str) -> list[dict]:
    """p50/p95/p99 over every selected server (histograms have no labels but le)."""
    return [
        q(
            f"histogram_quantile({p}, sum by (le) (rate({sel(f'{P}_{metric}_bucket')}[{RATE}])))",
            f"p{round(p * 100)}",
        )
        for p in (0.5, 0.95, 0.99)
    ]


def gauge(metric: str, legend: str, agg: str = "sum", by: str = "") -> dict:
    expr = f"{agg} by ({by}) ({sel(f'{P}_{metric}')})" if by else f"{agg}({sel(f'{P}_{metric}')})"
    return q(expr, legend)


def process(metric_or_expr: str) -> dict:
    """A process_* series of the durable-streams servers only: the same names come
    from every Python (and Go) target in a shared Prometheus, so keep the series
    whose target also exposes durable_streams_ready."""
    expr = metric_or_expr if "(" in metric_or_expr else sel(metric_or_expr)
    return q(f"{expr} and on (job, instance) {sel(f'{P}_ready')}", TARGET_LEGEND)


def panel(kind: str, title: str, unit: str, targets: list[dict], **extra) -> dict:
    return {"type": kind, "title": title, "unit": unit, "targets": targets, **extra}


def stat(title: str, unit: str, targets: list[dict], **extra) -> dict:
    return panel("stat", title, unit, targets, **extra)


def ts(title: str, unit: str, targets: list[dict], **extra) -> dict:
    return panel("timeseries", title, unit, targets, **extra)


def thresholds(*steps: tuple[float | None, str]) -> dict:
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


def lag(unit: str) -> dict:
    """A standby's lag as its primary reports it (label ``standby``, a replica name)."""
    return gauge(f"replication_lag_{unit}", "{{standby}}", "max", "namespace, job, standby")


def five_xx_ratio() -> str:
    all_ = f"sum(rate({sel(f'{P}_http_requests_total')}[{RATE}]))"
    bad = f"sum(rate({sel(f'{P}_http_requests_total', CODE_5XX)}[{RATE}]))"
    return f"({bad} or vector(0)) / {all_}"


ROWS: list[tuple[str, list[dict]]] = [
    (
        "Overview",
        [
            stat(
                "Ready / scraped servers",
                "none",
                [gauge("ready", "ready"), gauge("ready", "scraped", agg="count")],
            ),
            stat("Streams", "short", [gauge("streams", "streams")]),
            stat("Appends / s", "ops", [rate("appends_total", "appends/s")]),
            stat("Live readers", "short", [gauge("live_readers", "readers")]),
            stat(
                "Storage failed closed",
                "none",
                [gauge("storage_failed", "failed", agg="max")],
                thresholds=thresholds((None, "green"), (1, "red")),
            ),
            stat(
                "Lowest free disk",
                "percentunit",
                [q(f"min({sel(f'{P}_disk_free_bytes')} / {sel(f'{P}_disk_total_bytes')})", "free")],
                thresholds=thresholds((None, "red"), (0.1, "orange"), (0.2, "green")),
            ),
        ],
    ),
    (
        "Append and fsync latency",
        [
            ts(
                "Append latency (request received to durable)",
                "s",
                quantiles("append_duration_seconds"),
            ),
            ts("WAL fsync latency per batch", "s", quantiles("fsync_duration_seconds")),
        ],
    ),
    (
        "Segment write and metadata commit latency",
        [
            ts("Segment write latency per batch", "s", quantiles("segment_write_duration_seconds")),
            ts(
                "LMDB metadata commit latency per batch",
                "s",
                quantiles("metadata_commit_duration_seconds"),
            ),
        ],
    ),
    (
        "Throughput",
        [
            ts("Appends / s", "ops", [rate("appends_total", "appends")]),
            ts(
                "Bytes / s appended and read",
                "Bps",
                [rate("appended_bytes_total", "appended"), rate("read_bytes_total", "read")],
            ),
            ts(
                "Requests / s by method and code",
                "reqps",
                [rate("http_requests_total", "{{method}} {{code}}", "method, code")],
            ),
            ts(
                "Request latency p99 by method",
                "s",
                [
                    q(
                        "histogram_quantile(0.99, sum by (le, method) "
                        f"(rate({sel(f'{P}_http_request_duration_seconds_bucket')}[{RATE}])))",
                        "{{method}}",
                    )
                ],
            ),
            ts("Bytes per catch-up read", "bytes", quantiles("read_size_bytes")),
        ],
    ),
    (
        "Group commit",
        [
            ts("Appends per batch", "short", quantiles("batch_appends")),
            ts("Requests per batch", "short", quantiles("batch_requests")),
            ts("Bytes per batch", "bytes", quantiles("batch_bytes")),
            ts("Batches / s", "ops", [rate("batches_total", "batches")]),
        ],
    ),
    (
        "Readers and streams",
        [
            ts("Live readers by mode", "short", [gauge("live_readers", "{{mode}}", by="mode")]),
            ts("Streams", "short", [gauge("streams", TARGET_LEGEND, by=TARGET)]),
            ts(
                "Streams created, forked, deleted, expired / s",
                "ops",
                [
                    rate("streams_created_total", "created"),
                    rate("forks_created_total", "forked"),
                    rate("streams_deleted_total", "{{reason}}", "reason"),
                ],
            ),
            ts(
                "Producer duplicates, fencing, gaps / s",
                "ops",
                [rate("producer_events_total", "{{event}}", "event")],
            ),
        ],
    ),
    (
        "Errors",
        [
            ts(
                "4xx and 5xx / s",
                "reqps",
                [
                    q(
                        f"sum(rate({sel(f'{P}_http_requests_total', CODE_4XX)}[{RATE}])) or vector(0)",
                        "4xx",
                    ),
                    q(
                        f"sum(rate({sel(f'{P}_http_requests_total', CODE_5XX)}[{RATE}])) or vector(0)",
                        "5xx",
                    ),
                ],
            ),
            ts("5xx ratio", "percentunit", [q(five_xx_ratio(), "5xx / all")]),
            ts(
                "Batch failures / s by reason",
                "ops",
                [rate("batch_failures_total", "{{reason}}", "reason")],
            ),
            ts("Slow appends / s", "ops", [rate("slow_appends_total", "slow appends")]),
        ],
    ),
    (
        "Disk",
        [
            ts("Bytes on disk by part", "bytes", [gauge("disk_bytes", "{{part}}", by="part")]),
            ts(
                "Free space ratio",
                "percentunit",
                [
                    q(
                        f"{sel(f'{P}_disk_free_bytes')} / {sel(f'{P}_disk_total_bytes')}",
                        TARGET_LEGEND,
                    )
                ],
            ),
            ts("Free bytes", "bytes", [gauge("disk_free_bytes", TARGET_LEGEND, by=TARGET)]),
            # One segment file per stream: inodes run out before bytes with many small streams.
            ts(
                "Free and total inodes",
                "short",
                [
                    gauge("disk_free_inodes", "free " + TARGET_LEGEND, by=TARGET),
                    gauge("disk_total_inodes", "total " + TARGET_LEGEND, by=TARGET),
                ],
            ),
        ],
    ),
    (
        "Recovery (at the last start)",
        [
            stat(
                "Longest recovery",
                "s",
                [
                    gauge("recovery_duration_seconds", "recovery", agg="max"),
                    gauge("startup_duration_seconds", "start to ready", agg="max"),
                ],
            ),
            stat("Streams recovered", "short", [gauge("recovery_streams", "streams")]),
            stat("WAL frames replayed", "short", [gauge("recovery_wal_frames", "frames")]),
            # While a recovery runs: servers recovering, and how far they are.
            stat("Recovering now", "short", [gauge("recovering", "servers")]),
            stat("Streams checked", "short", [gauge("recovery_streams_checked", "streams")]),
            stat(
                "Starts killed during recovery",
                "short",
                [gauge("recovery_interrupted", "starts", agg="max")],
            ),
        ],
    ),
    (
        "Subscriptions",
        [
            stat(
                "Subscriptions by type",
                "short",
                [gauge("subscriptions", "{{type}}", by="type")],
            ),
            stat(
                "Failing webhook subscriptions",
                "short",
                [gauge("subscriptions_failing", "failing")],
                thresholds=thresholds((None, "green"), (1, "orange")),
            ),
            ts(
                "Webhook deliveries / s by outcome, and retries",
                "ops",
                [
                    rate("subscription_deliveries_total", "{{outcome}}", "outcome"),
                    rate("subscription_retries_total", "retries"),
                ],
            ),
            ts(
                "Wakes, claims and expired leases / s",
                "ops",
                [
                    rate("subscription_wakes_total", "wakes {{type}}", "type"),
                    rate("subscription_claims_total", "claims"),
                    rate("subscription_lease_expiries_total", "lease expiries"),
                ],
            ),
            ts(
                "Wake latency (append to worker woken)",
                "s",
                quantiles("subscription_wake_latency_seconds"),
            ),
            ts(
                "Streams with pending data",
                "short",
                [gauge("subscription_pending_streams", TARGET_LEGEND, by=TARGET)],
            ),
        ],
    ),
    (
        "Retention",
        [
            ts(
                "Bytes given back / s",
                "Bps",
                [rate("retention_reclaimed_bytes_total", "reclaimed")],
            ),
            ts(
                "Retained bytes by policy",
                "bytes",
                [gauge("retention_retained_bytes", "{{policy}}", by="policy")],
            ),
            ts(
                "Oldest retained record by policy",
                "s",
                [gauge("retention_oldest_age_seconds", "{{policy}}", agg="max", by="policy")],
            ),
        ],
    ),
    # Replica sets (docs/replication.md): every replica reports its role and term; the
    # in-sync count is the primary's (0 on a standby, so max per set is the primary's),
    # lag is per standby, on the primary. A replica set is one job (its Service).
    (
        "Replication",
        [
            ts(
                "Role per pod (1 = primary)",
                "none",
                [gauge("replication_primary", TARGET_LEGEND, agg="max", by=TARGET)],
            ),
            ts(
                "Term per pod",
                "none",
                [gauge("replication_term", TARGET_LEGEND, agg="max", by=TARGET)],
            ),
            ts(
                "In-sync replicas vs. minimum",
                "short",
                [
                    gauge("replication_in_sync_replicas", "in sync {{job}}", "max", SET),
                    gauge("replication_min_in_sync_replicas", "minimum {{job}}", "max", SET),
                ],
            ),
            stat(
                "Primaries degraded (too few in sync)",
                "none",
                [gauge("replication_degraded", "degraded", agg="max")],
                thresholds=thresholds((None, "green"), (1, "red")),
            ),
            ts(
                "Times each pod became primary",
                "short",
                [gauge("replication_failovers_total", TARGET_LEGEND, agg="max", by=TARGET)],
            ),
            ts(
                "Reads answered per pod (0 = refused: not current within the staleness bound)",
                "none",
                [gauge("replication_read_fresh", TARGET_LEGEND, agg="min", by=TARGET)],
            ),
        ],
    ),
    (
        "Replication lag and shipping",
        [
            ts("Lag per standby (bytes)", "bytes", [lag("bytes")]),
            ts("Lag per standby (seconds since caught up)", "s", [lag("seconds")]),
            ts("Lag per standby (batches)", "short", [lag("frames")]),
            ts(
                "WAL frames shipped / s",
                "ops",
                [rate("replication_frames_shipped_total", TARGET_LEGEND, TARGET)],
            ),
            ts(
                "Durable position (lsn) per pod",
                "none",
                [gauge("replication_durable_lsn", TARGET_LEGEND, agg="max", by=TARGET)],
            ),
        ],
    ),
    # The object-store archive (docs/backup.md): the primary archives (a standby's lag
    # stays 0); the last backup is the newest any pod of a set reports.
    (
        "Archive",
        [
            ts(
                "Archive lag (seconds) per pod",
                "s",
                [q(f"max by ({TARGET}) ({sel(f'{ARCHIVE}_lag_seconds')})", TARGET_LEGEND)],
            ),
            ts(
                "Archived position (lsn) and term per pod",
                "none",
                [
                    q(f"max by ({TARGET}) ({sel(f'{ARCHIVE}_archived_lsn')})", TARGET_LEGEND),
                    q(
                        f"max by ({TARGET}) ({sel(f'{ARCHIVE}_archived_term')})",
                        "term " + TARGET_LEGEND,
                    ),
                ],
            ),
            ts(
                "Local WAL not yet archived per pod",
                "bytes",
                [
                    q(f"max by ({TARGET}) ({sel(f'{ARCHIVE}_lag_bytes')})", TARGET_LEGEND),
                    q(
                        f"max by ({TARGET}) ({sel(f'{ARCHIVE}_pending_bytes')})",
                        "kept " + TARGET_LEGEND,
                    ),
                ],
            ),
            ts(
                "Frames not yet archived per pod",
                "none",
                [q(f"max by ({TARGET}) ({sel(f'{ARCHIVE}_lag_frames')})", TARGET_LEGEND)],
            ),
            ts(
                "Archive uploads / s and bytes / s",
                "ops",
                [
                    q(
                        f"sum by ({SET}) (rate({sel(f'{ARCHIVE}_uploads_total')}[{RATE}]))",
                        "uploads",
                    ),
                    q(
                        f"sum by ({SET}) (rate({sel(f'{ARCHIVE}_uploaded_bytes_total')}[{RATE}]))",
                        "bytes",
                    ),
                ],
            ),
            ts(
                "Archiving and failing pods",
                "none",
                [
                    q(f"sum by ({SET}) ({sel(f'{ARCHIVE}_archiving')})", "archiving"),
                    q(f"sum by ({SET}) ({sel(f'{ARCHIVE}_failing')})", "failing"),
                ],
            ),
            ts(
                "Last upload age and the archive timeout",
                "s",
                [
                    q(
                        f"time() - max by ({TARGET}) "
                        f"({sel(f'{ARCHIVE}_last_archived_timestamp_seconds')} > 0)",
                        TARGET_LEGEND,
                    ),
                    q(f"max by ({SET}) ({sel(f'{ARCHIVE}_timeout_seconds')})", "timeout"),
                ],
            ),
            ts(
                "Archive failures / s by kind",
                "ops",
                [
                    q(
                        f"sum by (kind) (rate({sel(f'{ARCHIVE}_failures_total')}[{RATE}]))",
                        "{{kind}}",
                    )
                ],
            ),
            stat(
                "Last backup age",
                "s",
                [
                    q(
                        f"time() - max by ({SET}) "
                        f"({sel(f'{ARCHIVE}_last_backup_timestamp_seconds')})",
                        "{{namespace}} {{job}}",
                    )
                ],
                thresholds=thresholds((None, "green"), (86400 * 1.5, "orange"), (86400 * 2, "red")),
            ),
        ],
    ),
    (
        "Process",
        [
            ts("Resident memory", "bytes", [process("process_resident_memory_bytes")]),
            ts(
                "CPU (cores)",
                "short",
                [process(f"rate({sel('process_cpu_seconds_total')}[{RATE}])")],
            ),
            ts("Open file descriptors", "short", [process("process_open_fds")]),
        ],
    ),
]


def _variable(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,  # on time range change
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "sort": 1,
        "hide": 0,
    }


VARIABLES = [
    {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "options": [],
        "refresh": 1,
        "regex": "",
        "hide": 0,
    },
    _variable("namespace", "Namespace", f"label_values({P}_ready, namespace)"),
    _variable("pod", "Pod", f'label_values({P}_ready{{namespace=~"$namespace"}}, pod)'),
    _variable(
        "instance",
        "Instance",
        f'label_values({P}_ready{{namespace=~"$namespace", pod=~"$pod"}}, instance)',
    ),
]


def _panel_json(spec: dict, pid: int, grid: dict) -> dict:
    defaults: dict = {"unit": spec["unit"]}
    if "thresholds" in spec:
        defaults["thresholds"] = spec["thresholds"]
        defaults["color"] = {"mode": "thresholds"}
    out = {
        "type": spec["type"],
        "id": pid,
        "title": spec["title"],
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "range": True, **t}
            for i, t in enumerate(spec["targets"])
        ],
    }
    if spec["type"] == "stat":
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value" if "thresholds" in spec else "none",
            "graphMode": "area",
            "textMode": "auto",
        }
    else:
        out["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return out


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
        height = 4 if all(p["type"] == "stat" for p in row) else 8
        x = 0
        for i, spec in enumerate(row):
            # Share the 24 columns out; the first panels take the remainder.
            width = 24 // len(row) + (1 if i < 24 % len(row) else 0)
            panels.append(_panel_json(spec, pid, {"h": height, "w": width, "x": x, "y": y}))
            pid += 1
            x += width
        y += height
    return {
        "id": None,
        "uid": "durable-streams",
        "title": "Durable Streams",
        "description": "Durable Streams servers: durable-append latency, group commit, "
        "throughput, readers, errors, disk, recovery, replication, archive. "
        "Source: observability/build_dashboard.py",
        "tags": ["durable-streams"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "templating": {"list": VARIABLES},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
