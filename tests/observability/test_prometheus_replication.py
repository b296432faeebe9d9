"""A real Prometheus scrapes a real replica set of three: every query of the
dashboard's replication rows has data, and the too-few-in-sync alert reacts.

The set is ``testkit.replicaset`` (three server processes and the emulated
Kubernetes API holding their Lease), labelled as the Prometheus Operator
labels pods (namespace ``obs``, pods ``ds-0`` to ``ds-2``, job ``orders``).
A client appends to the primary, so frames are shipped and lag is measured.

What is checked:

* every query of the "Replication" rows (variables "All") returns series,
  all finite: single servers, scraped in test_prometheus.py, have no
  replication series, so these panels are checked here;
* the values are the set's: exactly one pod is primary, and it is the one
  ``GET /replication`` names; three in sync against a minimum of two; a lag
  series for each standby and none for the primary; frames shipped by the
  primary; the primary's term and failover count at least 1;
* both standbys killed: the primary drops them from the in-sync set, the
  degraded panel shows it, and DurableStreamsTooFewInSync goes pending (its
  ``for:`` is a minute) for the primary only.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from testkit import needs
from testkit.prometheus import ALL, Prometheus, background, panel_queries, until_no_problems
from testkit.replicaset import ReplicaSet

BIN = {"Content-Type": "application/octet-stream"}
# Short leases, as in tests/replication: a silent standby leaves the in-sync set in about 1 s.
FAST = {
    "lease_duration": "3",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.5",
    "replication_wait": "2",
}

pytestmark = [
    pytest.mark.processes,
    needs.commands("prometheus", install="Debian's prometheus package (make system-deps)"),
]


def test_real_prometheus_scrapes_a_replica_set(tmp_path: Path) -> None:
    rs = ReplicaSet.up(3, tmp_path / "rs", settings=FAST)
    stop = threading.Event()
    errors: list[Exception] = []
    writer = None
    prom = None
    try:
        assert rs.replication, "the server has no replication settings"
        primary = rs.primary()
        standbys = sorted(s.name for s in rs.servers if s.name != primary.name)
        url = f"{primary.base}obs/{uuid.uuid4().hex}"
        assert httpx.put(url, headers=BIN, timeout=10).status_code == 201

        def appends() -> None:
            with httpx.Client(timeout=10) as c:
                while not stop.is_set():
                    assert c.post(url, headers=BIN, content=b"x" * 100).status_code == 204
                    time.sleep(0.02)

        writer = background(errors, appends)
        prom = Prometheus(
            tmp_path,
            [(f"127.0.0.1:{s.port}", {"namespace": "obs", "pod": s.name}) for s in rs.servers],
        )
        queries = dict(panel_queries(ALL, rows="replication"))
        assert len(queries) >= 10, queries

        def by_pod(expr: str, label: str = "pod") -> dict[str, float]:
            return {s["metric"].get(label, ""): float(s["value"][1]) for s in prom.query(expr)}

        # 1. Every replication panel has data, and it is the set's.
        def replication_answers() -> list[str]:
            problems = []
            for title, expr in panel_queries(ALL, rows="replication"):
                values = prom.values(expr)
                if not values or not all(math.isfinite(v) for v in values):
                    problems.append(f"no finite data {values}: {title}: {expr}")
            role = by_pod(queries["Role per pod (1 = primary)"])
            if role != {s.name: float(s.name == primary.name) for s in rs.servers}:
                problems.append(f"roles: {role}")
            in_sync = [
                prom.values(e)
                for t, e in panel_queries(ALL, rows="replication")
                if t == "In-sync replicas vs. minimum"
            ]
            if in_sync != [[3.0], [2.0]]:
                problems.append(f"in sync vs minimum: {in_sync}")
            for unit in ("bytes", "seconds since caught up", "batches"):
                lag = by_pod(queries[f"Lag per standby ({unit})"], "standby")
                if sorted(lag) != standbys:
                    problems.append(f"lag ({unit}) for {sorted(lag)}, not {standbys}")
            shipped = by_pod(queries["WAL frames shipped / s"])
            if not shipped.get(primary.name, 0) > 0:
                problems.append(f"frames shipped / s: {shipped}")
            for title in ("Term per pod", "Times each pod became primary"):
                if not by_pod(queries[title]).get(primary.name, 0) >= 1:
                    problems.append(f"{title}: {by_pod(queries[title])}")
            if prom.values(queries["Primaries degraded (too few in sync)"]) != [0.0]:
                problems.append("degraded while all are in sync")
            return problems

        until_no_problems(
            "every replication panel query has the set's data", replication_answers, prom, errors
        )

        # 2. Both standbys gone: too few in sync on the primary, and on it only.
        stop.set()
        writer.join(15)
        for name in standbys:
            rs.kill(name)

        def too_few_in_sync() -> list[str]:
            problems = []
            alerts = {
                (a["labels"].get("pod"), a["state"])
                for a in prom.alerts()
                if a["labels"]["alertname"] == "DurableStreamsTooFewInSync"
            }
            if alerts != {(primary.name, "pending")}:
                problems.append(f"TooFewInSync: {alerts}")
            if prom.values(queries["Primaries degraded (too few in sync)"]) != [1.0]:
                problems.append("not shown degraded")
            return problems

        until_no_problems("too few in sync", too_few_in_sync, prom, errors)
    finally:
        stop.set()
        if writer is not None:
            writer.join(15)
        if prom is not None:
            prom.stop()
        rs.down(grace=2)
    assert not errors, errors
