"""``--workers 2``: one scrape of /metrics shows the whole pod.

The requests every worker served, each counted once (also those a worker relays
to the writer), the live readers every worker holds (a killed worker's leave the
gauge, never counted twice), and the writer's own metrics, each family once.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testkit import wait_for
from testkit.pod_metrics import sample, scrape, worker_samples
from testkit.server_process import alive, connections_held, worker_pids

pytestmark = pytest.mark.processes

BIN = {"Content-Type": "application/octet-stream"}
CONNECTIONS = 8
MAX_ROUNDS = 20  # of CONNECTIONS connections each, for the two workers to share them
APPENDS = 10  # per connection
READS = 3  # per connection
RECORD = b"x" * 100


def _two_workers(srv) -> list[int]:
    return wait_for(lambda: (p := worker_pids(srv)) and len(p) == 2 and p, timeout=30)


def _appends_and_reads(url: str) -> int:
    """APPENDS appends, then READS whole reads, on one connection; the bytes read."""
    read = 0
    with httpx.Client(timeout=10) as client:
        for _ in range(APPENDS):
            assert client.post(url, content=RECORD, headers=BIN).status_code == 204
        for _ in range(READS):
            r = client.get(url, params={"offset": "-1"})
            assert r.status_code == 200, r.text
            read += len(r.content)
    return read


def _long_poll(url: str, offset: str, done: threading.Event) -> None:
    """A long-poll on its own connection, held until the server ends it (or dies)."""
    try:
        with httpx.Client(timeout=120) as client:
            client.get(url, params={"offset": offset, "live": "long-poll"})
    except httpx.HTTPError:
        pass  # its worker was killed
    finally:
        done.set()


def _open_long_polls(url: str, count: int) -> list[threading.Event]:
    tail = httpx.head(url).headers["stream-next-offset"]
    ended = [threading.Event() for _ in range(count)]
    for done in ended:
        threading.Thread(target=_long_poll, args=(url, tail, done), daemon=True).start()
    return ended


def _served(pids: list[int]) -> list[float]:
    return [
        sum(worker_samples(pid, "durable_streams_http_requests_total").values()) for pid in pids
    ]


def test_one_scrape_counts_every_request_of_every_worker_once(server_factory):
    srv = server_factory("--workers", "2", "--long-poll-timeout", "60").start()
    pids = _two_workers(srv)
    # Rounds of connections until each worker served some: which worker takes a
    # connection is the scheduler's choice (on a loaded machine one worker can take a
    # whole round), and a scrape that summed one worker would prove nothing.
    urls: list[str] = []
    read = 0
    with ThreadPoolExecutor(CONNECTIONS) as pool:
        while not all(_served(pids)) and len(urls) < MAX_ROUNDS * CONNECTIONS:
            batch = [f"{srv.base}m/{len(urls) + i}" for i in range(CONNECTIONS)]
            for url in batch:
                assert httpx.put(url, headers=BIN).status_code == 201
            read += sum(pool.map(_appends_and_reads, batch))
            urls += batch
    assert all(_served(pids)), f"one worker served every request of {len(urls)} connections"
    streams = len(urls)
    appends = streams * APPENDS
    assert read == streams * READS * APPENDS * len(RECORD)
    # A subscriptions' path: a worker relays it to the writer, and only the worker counts it.
    assert httpx.get(f"{srv.base}__ds/subscriptions/none").status_code == 404

    m = scrape(srv.url)  # also: no family twice
    requests = "durable_streams_http_requests_total"
    assert sample(m, requests, method="POST", code="204") == appends
    assert sample(m, requests, method="PUT", code="201") == streams
    assert sample(m, requests, method="GET", code="200") == streams * READS
    duration = "durable_streams_http_request_duration_seconds_count"
    assert sample(m, duration, method="POST", status_class="2xx") == appends
    assert sample(m, "durable_streams_append_duration_seconds_count") == appends
    assert sample(m, "durable_streams_read_bytes_total") == read
    assert sample(m, "durable_streams_read_size_bytes_count") == streams * READS
    assert sample(m, requests, method="GET", code="404") == 1
    # The writer's own, as a single server's.
    assert sample(m, "durable_streams_appends_total") == appends
    assert sample(m, "durable_streams_batches_total") >= 1
    assert sample(m, "durable_streams_streams") == streams
    assert sample(m, "durable_streams_ready") == 1

    ended = _open_long_polls(urls[0], 1)
    gauge = "durable_streams_live_readers"
    wait_for(lambda: sample(scrape(srv.url), gauge, mode="long-poll") == 1)
    srv.stop()
    assert all(done.wait(30) for done in ended)


def test_a_killed_workers_live_readers_leave_the_gauge(server_factory):
    srv = server_factory("--workers", "2", "--long-poll-timeout", "60").start()
    pids = _two_workers(srv)
    url = f"{srv.base}m/live"
    assert httpx.put(url, headers=BIN).status_code == 201
    ended = _open_long_polls(url, 6)
    gauge = "durable_streams_live_readers"
    wait_for(lambda: sample(scrape(srv.url), gauge, mode="long-poll") == 6)
    wait_for(lambda: sum(connections_held(pid, srv.port) for pid in pids) == 6)
    held = {pid: connections_held(pid, srv.port) for pid in pids}
    victim = max(held, key=lambda pid: held[pid])  # it holds some, maybe all

    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: not alive(victim), timeout=30)
    wait_for(lambda: sum(done.is_set() for done in ended) == held[victim])
    _two_workers(srv)  # replaced
    wait_for(lambda: sample(scrape(srv.url), gauge, mode="long-poll") == 6 - held[victim])
    srv.stop()
    assert all(done.wait(30) for done in ended)
