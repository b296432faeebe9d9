"""The metrics of the HTTP requests a process serves, and how a pod of processes sums them.

A single server counts its requests in ``Metrics`` (which is a ``RequestMetrics``).
With ``--workers N`` the workers serve the requests, each in its own process: each
builds a ``RequestMetrics`` in prometheus_client's multiprocess mode (the writer
sets ``PROMETHEUS_MULTIPROC_DIR`` in their environment, so their values live in
files of one directory), and the writer's scrape shows these families as the sum
of every worker's files and its own values (``PodRequests``): one scrape, the whole
pod, every request counted once (the writer counts none of the requests workers
relay to it; they were counted where they arrived). Names and labels are those of a
single server's. The live readers are not here: their slots are the writer's, the
pod's (``workers/linked_limits.py``), and so is their gauge (``Metrics``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

PREFIX = "durable_streams"

# Tens of microseconds (a cached fsync) to seconds (a struggling disk).
LATENCY_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
SIZE_BUCKETS = tuple(64 * 4**i for i in range(11))  # 64 B .. 64 MiB

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"})

App = Callable[[Any, Any, Any], Awaitable[None]]  # an ASGI app: (scope, receive, send)


class RequestMetrics:
    """What the protocol layer records per request (``Context.metrics``), and the
    request count and duration around it (``measure``)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        # (method, status) -> the labelled children: .labels() is a lock and a dict walk.
        self._request_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        r = registry
        self.append_seconds = Histogram(
            f"{PREFIX}_append_duration_seconds",
            "Append latency, request received to durable.",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.request_seconds = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "HTTP request duration (live reads: until the response ends).",
            ("method", "status_class"),
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.read_size = Histogram(
            f"{PREFIX}_read_size_bytes",
            "Bytes returned per catch-up read.",
            registry=r,
            buckets=SIZE_BUCKETS,
        )
        self.read_bytes = Counter(
            f"{PREFIX}_read_bytes_total", "Payload bytes served by reads.", registry=r
        )
        self.requests = Counter(
            f"{PREFIX}_http_requests_total", "HTTP requests.", ("method", "code"), registry=r
        )
        self.slow_appends = Counter(
            f"{PREFIX}_slow_appends_total", "Appends over the slow threshold.", registry=r
        )

    def served(self) -> list[Collector]:
        """The collectors of the families above (what ``PodRequests`` sums)."""
        return [
            self.append_seconds,
            self.request_seconds,
            self.read_size,
            self.read_bytes,
            self.requests,
            self.slow_appends,
        ]

    def on_request(self, method: str, status: int, seconds: float) -> None:
        m = method if method in METHODS else "other"
        children = self._request_children.get((m, status))
        if children is None:  # a few methods times the statuses the app answers: bounded
            children = self._request_children[(m, status)] = (
                self.requests.labels(m, str(status)),
                self.request_seconds.labels(m, f"{status // 100}xx"),
            )
        children[0].inc()
        children[1].observe(seconds)

    async def measure(self, app: App, scope: Any, receive: Any, send: Any) -> None:
        """``app``'s answer to one request, its method, status and duration recorded."""
        started = time.perf_counter()
        status = 500

        async def send_and_note(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, send_and_note)
        finally:
            self.on_request(scope["method"], status, time.perf_counter() - started)


class PodRequests:
    """The request families of a writer with workers: each sample the sum of the
    workers' (their multiprocess files in ``directory``) and the writer's own."""

    def __init__(self, directory: str, own: Sequence[Collector]) -> None:
        self._workers = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]
        self._own = own

    def collect(self) -> Iterator[Metric]:
        files = self._workers.collect()  # type: ignore[no-untyped-call]
        workers = {family.name: family for family in files}
        for collector in self._own:
            for family in collector.collect():
                theirs = workers.pop(family.name, None)
                yield family if theirs is None else _summed(family, theirs.samples)


def _summed(family: Metric, more: Iterable[Sample]) -> Metric:
    """``family`` with ``more``'s values added, sample by sample (name and labels)."""
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in (*family.samples, *more):
        key = (sample.name, tuple(sorted(sample.labels.items())))
        totals[key] = totals.get(key, 0.0) + sample.value
    out = Metric(family.name, family.documentation, family.type, family.unit)
    out.samples = [Sample(name, dict(labels), value) for (name, labels), value in totals.items()]
    return out
