"""The workers workload's own parts: the model's arithmetic, and the HTTP ceiling in
several processes, whose children ``descendants`` finds (the CPU per append of a
multi-process server is the sum over those)."""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from bench.results import WorkersResult
from bench.servers import Server
from bench.workers import descendants, model, per_batch

pytestmark = pytest.mark.processes


def side(cpu_ms: float, cpu_ms_writer: float) -> WorkersResult:
    return WorkersResult(
        workers=2,
        processes=3,
        appends_per_s=1.0,
        p50_ms=1.0,
        p99_ms=1.0,
        errors=0,
        acknowledged=1,
        held=1,
        appends_1_per_s=1.0,
        appends_1_errors=0,
        catchup_mib_per_s=1.0,
        cpu_ms=cpu_ms,
        cpu_ms_writer=cpu_ms_writer,
        cpu_ms_writer_loop=cpu_ms_writer / 2,
        cpu_ms_writer_kernel=cpu_ms_writer / 4,
        requests_per_batch=10.0,
        live_p50_ms=1.0,
        live_p99_ms=1.0,
        idle_wake_p99_ms=1.0,
        idle_woken=1,
        idle_readers=1,
    )


def test_the_writer_is_the_serial_part_and_the_rest_divides_among_the_cores():
    # 0.02 ms of the writer's and 0.08 ms of the workers' per append: 10,000/s on one core.
    points = {m.cores: m for m in model(side(cpu_ms=0.1, cpu_ms_writer=0.02))}
    assert sorted(points) == [2, 4, 8, 16]
    eight = points[8]
    assert eight.amdahl_per_s == pytest.approx(8 / (0.00002 * 8 + 0.00008))  # 33,333/s
    assert eight.amdahl_speedup == pytest.approx(10 / 3)
    assert eight.bound_per_s == pytest.approx(50_000)  # the writer's core is full
    assert eight.bound_speedup == pytest.approx(5)
    assert points[2].bound_per_s == pytest.approx(20_000)  # the cores are the limit
    for m in points.values():
        assert m.amdahl_per_s <= m.bound_per_s


def test_a_server_whose_writer_does_everything_gains_nothing_from_cores():
    for m in model(side(cpu_ms=0.1, cpu_ms_writer=0.1)):
        assert m.amdahl_speedup == pytest.approx(1) and m.bound_speedup == pytest.approx(1)


def test_the_ceiling_in_two_processes_serves_and_leaves_none_behind(tmp_path: Path):
    srv = Server("ceiling", tmp_path)
    srv.extra_args = ["2"]
    srv.start(timeout=60)
    try:
        children = descendants(srv.pids()[0])
        assert len(children) == 2
        for _ in range(20):  # fresh connections, each accepted by one of them
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("POST", "/v1/stream/a", body=b"x")
            assert conn.getresponse().status == 204
            conn.close()
    finally:
        status = srv.stop()
    assert status == 0
    assert not [c for c in children if Path(f"/proc/{c}").exists()]


def test_requests_per_batch_are_the_histograms_growth_between_two_readings():
    assert per_batch((100.0, 10.0), (400.0, 20.0)) == 30.0
    assert per_batch((100.0, 10.0), (100.0, 10.0)) is None  # no batch between: not a zero
