"""The operator's own Prometheus metrics, and the small HTTP server that serves them.

What a platform team needs to see from outside: whether reconciles succeed
(a counter by outcome, their duration), when each DurableStream was last
reconciled whole (a timestamp per object: labels are namespace and name,
bounded by the number of objects), how many objects stand in each condition,
and whether this process is the leader. The alert
``DurableStreamReconcileFailing`` reads the counter.

The server answers ``/metrics`` and ``/healthz`` on one port. ``/healthz``
asks a callback (the leadership's), so that a standby waiting for the Lease
is alive without running kopf, and a leader is alive only while kopf is.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

PREFIX = "durable_streams_operator"
# What became of one reconcile: the whole spec applied; a change the operator will not
# or cannot make (ChangeRefused, ExpansionNotAllowed); the API server refused a write.
OUTCOMES = ("applied", "refused", "failed")
# Every condition the status carries; each is counted by status even when no object has it
# (FailingOver: a replica set's, True from a primary lost until a standby holds the Lease).
CONDITIONS = ("Ready", "Progressing", "Degraded", "Accepted", "Analytics", "FailingOver")
STATUSES = ("True", "False", "Unknown")

RECONCILES = Counter(
    f"{PREFIX}_reconciles",
    "Reconciles of DurableStreams, by outcome (applied, refused, failed)",
    ["outcome"],
)
for _outcome in OUTCOMES:
    RECONCILES.labels(_outcome)
RECONCILE_SECONDS = Histogram(
    f"{PREFIX}_reconcile_duration_seconds",
    "Time one reconcile of a DurableStream took",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LAST_SUCCESS = Gauge(
    f"{PREFIX}_last_successful_reconcile_timestamp_seconds",
    "When the DurableStream's whole spec was last applied (Unix time)",
    ["namespace", "name"],
)
LEADER = Gauge(f"{PREFIX}_leader", "1 while this process holds the Lease and runs the reconciles")


class _ConditionCollector(Collector):
    """DurableStreams by condition and status, from the last status this operator saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict[str, str]] = {}
        # Deleted objects: a round that read one before it went (and writes its status
        # after the watch reported the deletion) must not count it again.
        self._gone: set[tuple[str, str]] = set()

    def observe(self, namespace: str, name: str, conditions: list[dict[str, Any]]) -> None:
        with self._lock:
            if (namespace, name) in self._gone:
                return
            self._objects[(namespace, name)] = {
                str(c.get("type")): str(c.get("status")) for c in conditions
            }

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._objects.pop((namespace, name), None)
            self._gone.add((namespace, name))

    def seen(self, namespace: str, name: str) -> None:
        """The watch reports the object (again: one of a deleted one's name was made)."""
        with self._lock:
            self._gone.discard((namespace, name))

    def gone(self, namespace: str, name: str) -> bool:
        with self._lock:
            return (namespace, name) in self._gone

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()
            self._gone.clear()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{PREFIX}_objects",
            "DurableStreams whose condition has the status, by condition and status",
            labels=["condition", "status"],
        )
        with self._lock:
            states = list(self._objects.values())
        for cond in CONDITIONS:
            for status in STATUSES:
                family.add_metric([cond, status], sum(1 for s in states if s.get(cond) == status))
        yield family


CONDITION_COUNTS = _ConditionCollector()
REGISTRY.register(CONDITION_COUNTS)


def outcome_label(reason: str) -> str:
    """The counter's label for an ``Outcome.reason``."""
    if reason == "Applied":
        return "applied"
    if reason == "ApplyFailed":
        return "failed"
    return "refused"


def record_reconcile(namespace: str, name: str, reason: str, seconds: float, at: float) -> None:
    """Count one reconcile; an applied one also moves the object's last-success time."""
    RECONCILES.labels(outcome_label(reason)).inc()
    RECONCILE_SECONDS.observe(seconds)
    if reason == "Applied" and not CONDITION_COUNTS.gone(namespace, name):
        LAST_SUCCESS.labels(namespace, name).set(at)


def seen(namespace: str, name: str) -> None:
    """The watch reports a DurableStream: its series may be written (again)."""
    CONDITION_COUNTS.seen(namespace, name)


def forget(namespace: str, name: str) -> None:
    """A deleted DurableStream leaves no series behind, not even one a round that read it
    before it went writes after (until the watch reports one of its name again)."""
    CONDITION_COUNTS.forget(namespace, name)
    with contextlib.suppress(KeyError):
        LAST_SUCCESS.remove(namespace, name)


def restart() -> None:
    """A new run of the operator: the objects are seen again as kopf lists them (one
    deleted while no operator ran leaves no series behind)."""
    CONDITION_COUNTS.clear()
    LAST_SUCCESS.clear()


def serve(
    host: str,
    port: int,
    healthy: Callable[[], bool],
    registry: CollectorRegistry = REGISTRY,
) -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` in a daemon thread; returns the server (to stop it)."""
    base = MetricsHandler.factory(registry)

    class Handler(base):  # type: ignore[misc, valid-type]
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/healthz":
                ok = healthy()
                body = b"ok\n" if ok else b"not healthy\n"
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape every 30 s is not news

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server
