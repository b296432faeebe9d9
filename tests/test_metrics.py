"""Metrics move with real traffic against the real server (in-process, on the real engine)."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.asgi import InProcessServer


@pytest.fixture
def srv(app_server) -> InProcessServer:
    return app_server()


def scrape(srv: InProcessServer) -> dict[tuple[str, tuple], float]:
    text = srv.http.get(f"{srv.url}/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m, name, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_and_histograms_follow_traffic(srv):
    http = srv.http
    before = scrape(srv)
    url = f"{srv.base}metrics/{uuid.uuid4().hex}"
    ct = {"Content-Type": "application/octet-stream"}
    http.put(url, headers=ct)
    for _ in range(25):
        assert http.post(url, headers=ct, content=b"x" * 40).status_code == 204
    p = {"Producer-Id": "m", "Producer-Epoch": "0"}
    http.post(url, headers=ct | p | {"Producer-Seq": "0"}, content=b"y")
    http.post(url, headers=ct | p | {"Producer-Seq": "0"}, content=b"y")  # duplicate
    http.post(url, headers=ct | p | {"Producer-Seq": "7"}, content=b"y")  # gap
    assert len(http.get(url).content) == 25 * 40 + 1
    http.post(url, headers={"Content-Type": "text/plain"}, content=b"z")  # 409
    after = scrape(srv)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("durable_streams_appends_total") == 26
    assert delta("durable_streams_appended_bytes_total") == 25 * 40 + 1
    assert delta("durable_streams_append_duration_seconds_count") == 26
    assert delta("durable_streams_append_duration_seconds_sum") > 0
    assert delta("durable_streams_fsync_duration_seconds_count") >= 1
    assert delta("durable_streams_metadata_commit_duration_seconds_count") >= 1
    assert delta("durable_streams_batch_appends_sum") == 26
    assert delta("durable_streams_read_bytes_total") == 25 * 40 + 1
    assert delta("durable_streams_streams_created_total") == 1
    assert delta("durable_streams_producer_events_total", event="duplicate") == 1
    assert delta("durable_streams_producer_events_total", event="gap") == 1
    assert delta("durable_streams_http_requests_total", method="POST", code="204") == 26
    assert delta("durable_streams_http_requests_total", method="POST", code="409") == 2
    assert delta("durable_streams_http_requests_total", method="GET", code="200") == 1
    assert value(after, "durable_streams_streams") >= 1
    assert value(after, "durable_streams_ready") == 1
    assert value(after, "durable_streams_disk_bytes", part="segments") > 0
    # No stream path ever becomes a label.
    assert not any("metrics/" in str(labels) for _, labels in after)


def test_health_endpoints(srv):
    assert srv.http.get(f"{srv.url}/healthz").status_code == 200
    r = srv.http.get(f"{srv.url}/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True
