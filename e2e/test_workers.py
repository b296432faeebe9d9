"""``--workers N`` as processes: a worker killed is replaced and nothing acknowledged is
lost; a stop ends every process cleanly; a port in use stops the start.

The writer's own kill -9 is in ``test_crash.py`` (its workers go with it); the whole
protocol through workers is the conformance suite's third run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest

from stream_server.workers.supervisor import cpu_count
from testkit import wait_for
from testkit.server_process import alive, children_of, worker_pids
from testkit.servers import Child, free_port, http_status, stream_server_command
from testkit.stream_reads import read_all

pytestmark = pytest.mark.processes

BIN = {"Content-Type": "application/octet-stream"}
WRITERS = 8


async def _producer(
    client: httpx.AsyncClient, url: str, pid: str, stop: asyncio.Event
) -> list[int]:
    """Idempotent appends until ``stop``; an append whose answer was lost is sent again
    with the same tuple until it is answered. Returns the sequence numbers acknowledged."""
    acked: list[int] = []
    seq = 0
    while not stop.is_set():
        headers = BIN | {"Producer-Id": pid, "Producer-Epoch": "0", "Producer-Seq": str(seq)}
        try:
            r = await client.post(url, content=f"<{pid}-{seq}>".encode(), headers=headers)
        except httpx.HTTPError:
            continue  # the worker holding this connection died: the same tuple again
        if r.status_code == 503:
            continue
        assert r.status_code in (200, 204), r.text
        acked.append(seq)
        seq += 1
    return acked


async def _write_while(action, urls: list[str]) -> list[list[int]]:
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=32)) as client:
        tasks = [
            asyncio.create_task(_producer(client, url, f"p{i}", stop)) for i, url in enumerate(urls)
        ]
        await asyncio.sleep(0.5)
        await asyncio.to_thread(action)
        await asyncio.sleep(0.5)
        stop.set()
        return await asyncio.gather(*tasks)


def test_a_killed_worker_is_replaced_and_nothing_acknowledged_is_lost(server_factory):
    srv = server_factory("--workers", "2").start()
    urls = [f"{srv.base}w/{i}" for i in range(WRITERS)]
    for url in urls:
        assert httpx.put(url, headers=BIN).status_code == 201
    before = wait_for(lambda: (p := worker_pids(srv)) and len(p) == 2 and p)
    victim = before[0]

    def kill_one() -> None:
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not alive(victim), timeout=30)

    acked = asyncio.run(_write_while(kill_one, urls))
    after = wait_for(lambda: (p := worker_pids(srv)) and len(p) == 2 and p, timeout=30)
    assert victim not in after and before[1] in after, (before, after)
    assert "worker 0 exited" in srv.log() or "worker 1 exited" in srv.log()
    for i, url in enumerate(urls):
        body = read_all(url).decode()
        got = [int(m.split("-")[1]) for m in body.strip("<>").split("><")] if body else []
        assert got == sorted(set(got)), f"p{i}: duplicated or out of order"
        assert set(acked[i]) <= set(got), f"p{i}: acknowledged appends lost"
        assert got == list(range(len(got))), f"p{i}: a gap: {got[:20]}"
    assert sum(map(len, acked)) > 0
    assert httpx.get(f"{srv.url}/readyz").status_code == 200


def test_a_stop_ends_the_workers_and_the_writer_cleanly(server_factory):
    srv = server_factory("--workers", "2", "--long-poll-timeout", "60").start()
    url = f"{srv.base}stop"
    assert httpx.put(url, headers=BIN).status_code == 201
    children = wait_for(lambda: (p := worker_pids(srv)) and len(p) == 2 and p)

    async def poll_then_stop() -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as client:
            poll = asyncio.create_task(
                client.get(url, params={"offset": "now", "live": "long-poll"})
            )
            await asyncio.sleep(0.5)  # the long-poll is waiting at the writer
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            return await poll

    started = time.monotonic()
    answer = asyncio.run(poll_then_stop())
    assert answer.status_code == 204  # ended as on its timeout, long before 60 s
    assert time.monotonic() - started < 30
    assert srv.proc is not None and srv.proc.wait(timeout=30) == 0
    assert not any(alive(pid) for pid in children)
    assert "stopped cleanly" in srv.log()


def test_by_default_one_worker_per_cpu_the_process_may_use(tmp_path):
    """No ``--workers`` and no DS_WORKERS (the tests' servers have it set to 1): as many
    workers as ``--workers 0`` counts, and one process where that is one CPU."""
    env = {k: v for k, v in os.environ.items() if k != "DS_WORKERS"}
    port = free_port()
    command = stream_server_command(port, tmp_path / "data")
    server = Child("server", command, tmp_path / "server.log", env=env)
    server.start(lambda: http_status(port, "/readyz") == 200, timeout=60)
    try:
        assert server.proc is not None
        pid, cpus = server.proc.pid, cpu_count()
        expected = cpus if cpus > 1 else 0
        wait_for(
            lambda: len(children_of(pid)) == expected,
            message=lambda: f"{expected} workers, {children_of(pid)}: {server.log_tail()}",
        )
    finally:
        assert server.stop() == 0, server.log_tail()


def test_a_port_in_use_stops_the_start_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*stream_server_command(port, tmp_path / "data", "--workers", "2")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2  # a setting's refusal: --port (tests/test_start_refusals.py)
    assert f"cannot listen on 127.0.0.1 port {port}" in proc.stderr + proc.stdout
