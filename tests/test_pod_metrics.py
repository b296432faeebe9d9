"""A writer's scrape with workers (``Metrics.gather_workers``): the request families are
the sum of the workers' multiprocess files and the writer's own values, each once.

In-process: two "workers" here are ``RequestMetrics`` on prometheus_client's
multiprocess values under two made-up pids, writing real files in a real
directory, as a worker process does (``e2e/test_worker_metrics.py`` runs the
processes themselves).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import values

from stream_server.metrics import Metrics
from stream_server.request_metrics import RequestMetrics
from testkit.pod_metrics import parse, sample

WORKER_A, WORKER_B = 4242, 4343


def worker(
    pid: int,
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[RequestMetrics], None],
) -> None:
    """A worker's metrics, as ``WorkerApp`` builds them, under ``pid``, and what it
    records while it ``serve``s (a labelled series is made on its first use)."""
    with monkeypatch.context() as m:
        m.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        m.setattr(values, "ValueClass", values.MultiProcessValue(lambda: pid))
        serve(RequestMetrics(None))


def serve_a(a: RequestMetrics) -> None:
    for _ in range(3):
        a.on_request("POST", 204, 0.001)
        a.append_seconds.observe(0.001)
    a.read_bytes.inc(100)


def serve_b(b: RequestMetrics) -> None:
    b.on_request("POST", 204, 0.003)
    b.on_request("GET", 200, 0.003)
    b.append_seconds.observe(0.003)
    b.read_bytes.inc(20)


def writer(directory: Path, live: int) -> Metrics:
    metrics = Metrics()
    metrics.bind(
        streams=lambda: 0,
        live=lambda mode: live if mode == "long-poll" else 0,
        data_dir=str(directory),
        segment_bytes=lambda: 0,
        ready=lambda: True,
        failed=lambda: False,
    )
    metrics.gather_workers(str(directory))
    return metrics


def test_the_scrape_sums_every_workers_requests_and_the_writers_own(tmp_path, monkeypatch):
    worker(WORKER_A, tmp_path, monkeypatch, serve_a)
    worker(WORKER_B, tmp_path, monkeypatch, serve_b)
    w = writer(tmp_path, live=1)
    w.append_seconds.observe(0.0001)  # the writer serves some itself (a replica set's)

    m = parse(w.exposition().decode())  # each family once
    assert not w.counts_requests
    requests = "durable_streams_http_requests_total"
    assert sample(m, requests, method="POST", code="204") == 4
    assert sample(m, requests, method="GET", code="200") == 1
    durations = "durable_streams_http_request_duration_seconds_count"
    assert sample(m, durations, method="POST", status_class="2xx") == 4
    buckets = "durable_streams_append_duration_seconds_bucket"
    assert sample(m, buckets, le="0.0001") == 1
    assert sample(m, buckets, le="0.001") == 4
    assert sample(m, buckets, le="0.0025") == 4
    assert sample(m, buckets, le="0.005") == 5
    assert sample(m, buckets, le="+Inf") == 5
    assert sample(m, "durable_streams_append_duration_seconds_count") == 5
    assert sample(m, "durable_streams_read_bytes_total") == 120
    # The writer's own: the pod's live readers hold its slots (workers/linked_limits.py).
    assert sample(m, "durable_streams_live_readers", mode="long-poll") == 1
    assert sample(m, "durable_streams_ready") == 1  # and the writer's own, unchanged


def test_a_single_server_counts_its_own_requests():
    metrics = Metrics()
    assert metrics.counts_requests
    metrics.on_request("POST", 204, 0.001)
    m = parse(metrics.exposition().decode())
    assert sample(m, "durable_streams_http_requests_total", method="POST", code="204") == 1
