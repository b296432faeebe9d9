"""Probes while a pod recovers, and after its storage failed closed (issue 15, finding 7).

Recovery runs behind an open socket: ``/healthz`` answers 200 (alive),
``/readyz`` 503 with the progress, stream requests 503 with Retry-After, and
``/metrics`` says ``recovering 1``. To hold a real recovery open for as long
as the test needs, without a timing assumption, the test takes LMDB's write
lock on the server's metadata environment (a second process may, LMDB's lock
is between processes): recovery replays the WAL into LMDB and waits on that
lock until the test lets go.

A start killed during recovery (as an OOM kill would) is counted by the
next start, which logs it and exports ``recovery_interrupted``.

A server whose storage failed closed (an injected EIO on a WAL flush) answers
``/healthz`` with 503, so the kubelet's liveness probe restarts it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import lmdb
import pytest

from stream_format import wal as walmod
from stream_format.layout import Layout
from testkit import wait_for
from testkit.servers import Child, env_with, free_port, http_status, stream_server_command
from testkit.stream_reads import read_all

pytestmark = pytest.mark.processes

BIN = {"Content-Type": "application/octet-stream"}
STREAMS = 20


def crashed_with_wal(server_factory, data: Path) -> dict[str, bytes]:
    """A data directory whose server was killed with WAL frames to replay."""
    srv = server_factory(data_dir=data).start()
    written = {}
    with httpx.Client(timeout=10) as c:
        for i in range(STREAMS):
            url = f"{srv.base}s{i}"
            assert c.put(url, headers=BIN).status_code == 201
            assert c.post(url, headers=BIN, content=b"x" * (i + 1)).status_code == 204
            written[f"s{i}"] = b"x" * (i + 1)
    srv.kill()
    assert walmod.wal_files(Layout(data).wal), "the killed server left no WAL to replay"
    return written


def metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    m = re.search(rf"^durable_streams_{name} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_probes_answer_while_recovery_runs(server_factory, tmp_path):
    data = tmp_path / "data"
    written = crashed_with_wal(server_factory, data)
    env = lmdb.open(str(Layout(data).meta), max_dbs=16, max_readers=256)
    held = env.begin(write=True)  # recovery's first LMDB write waits on this
    port = free_port()
    child = Child(
        "server", stream_server_command(port, data), tmp_path / "recovering.log", env=env_with()
    )
    try:
        # Before the fix the socket opened only after recovery: nothing answered here.
        child.start(lambda: http_status(port, "/healthz", timeout=1) == 200)
        base = f"http://127.0.0.1:{port}"
        r = httpx.get(f"{base}/readyz", timeout=10)
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["ready"] is False and "recovery not finished" in body["problems"]
        assert set(body["recovery"]) >= {"phase", "streams_checked", "streams_total"}
        assert body["recovery"]["phase"] in ("starting", "wal")
        s = httpx.get(f"{base}/v1/stream/s0", params={"offset": "-1"}, timeout=10)
        assert s.status_code == 503 and int(s.headers["retry-after"]) >= 1
        assert "recovery not finished" in s.text
        # Nothing may be created behind recovery's back: the stream exists on disk.
        assert httpx.put(f"{base}/v1/stream/s0", headers=BIN, timeout=10).status_code == 503
        assert metric(port, "recovering") == 1
        assert metric(port, "ready") == 0
    finally:
        held.abort()
        env.close()
    try:
        wait_for(lambda: http_status(port, "/readyz", timeout=1) == 200, message="ready")
        assert metric(port, "recovering") == 0
        assert metric(port, "recovery_streams") == STREAMS
        assert metric(port, "recovery_streams_checked") == STREAMS
        assert metric(port, "recovery_wal_frames") > 0
        for name, content in written.items():
            assert read_all(f"http://127.0.0.1:{port}/v1/stream/{name}") == content
        log = child.log_tail(20000)
        assert "recovery started (RSS" in log and "recovery finished in" in log
    finally:
        child.stop()


def test_a_start_killed_during_recovery_is_reported_by_the_next(server_factory, tmp_path):
    data = tmp_path / "data"
    written = crashed_with_wal(server_factory, data)
    env = lmdb.open(str(Layout(data).meta), max_dbs=16, max_readers=256)
    held = env.begin(write=True)
    try:
        for attempt in range(2):  # two starts killed mid-recovery, as an OOM loop does
            port = free_port()
            child = Child(
                "server", stream_server_command(port, data), tmp_path / f"killed{attempt}.log"
            )
            child.start(lambda p=port: http_status(p, "/healthz", timeout=1) == 200)
            assert metric(port, "recovering") == 1
            assert metric(port, "recovery_interrupted") == attempt
            child.kill()
    finally:
        held.abort()
        env.close()
    srv = server_factory(data_dir=data).start()
    assert metric(srv.port, "recovery_interrupted") == 2
    assert "recovery was interrupted 2 time(s)" in srv.log()
    assert all(read_all(f"{srv.base}{n}") == c for n, c in written.items())
    srv.stop()
    srv = server_factory(data_dir=data).start()  # a recovery that finished clears the count
    assert metric(srv.port, "recovery_interrupted") == 0


def test_healthz_fails_once_storage_failed_closed(server_factory):
    srv = server_factory(env={"DS_FAULT": "eio:fsync:2"}).start()
    assert httpx.get(f"{srv.url}/healthz").status_code == 200
    assert httpx.put(f"{srv.base}a", headers=BIN).status_code == 201
    r = httpx.post(f"{srv.base}a", headers=BIN, content=b"lost")
    assert r.status_code == 503 and "failed closed" in r.text
    h = httpx.get(f"{srv.url}/healthz")
    assert h.status_code == 503 and "storage failed closed" in h.text
    assert httpx.get(f"{srv.url}/readyz").status_code == 503
    assert read_all(f"{srv.base}a") == b""  # reads go on until the restart


def test_a_recovery_that_fails_stops_the_server_naming_the_file(server_factory, tmp_path):
    """A WAL file recovery cannot replay (a bad frame before the newest file's end)
    stops the server with status 2, as a refused layout does; probes said so meanwhile."""
    data = tmp_path / "data"
    crashed_with_wal(server_factory, data)
    wal_dir = Layout(data).wal
    first = walmod.wal_files(wal_dir)[-1]
    raw = bytearray(first.read_bytes())
    raw[walmod.HEADER_SIZE + walmod.FRAME_HEADER.size] ^= 0xFF  # the first frame's body
    first.write_bytes(bytes(raw))
    number = walmod.file_number(first) + 1
    (wal_dir / f"{number:016d}.wal").write_bytes(walmod.encode_header(number))
    child = Child("server", stream_server_command(free_port(), data), tmp_path / "bad.log")
    child.start(lambda: True)
    assert child.proc is not None
    assert child.proc.wait(timeout=60) == 2, child.log_tail()
    assert f"{first}: bad frame" in child.log_tail()


def test_readyz_body_is_json_with_the_streams_count(server_factory):
    srv = server_factory().start()
    httpx.put(f"{srv.base}one", headers=BIN)
    body = json.loads(httpx.get(f"{srv.url}/readyz").text)
    assert body == {"ready": True, "problems": [], "streams": 1}
