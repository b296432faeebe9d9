"""Faults against real server processes and real files.

Deterministic crash points (DS_FAULT) cover every window of a batch; a failed
flush fails the server closed; a corrupt record is refused, other streams
keep being served; disk full on a real small filesystem gives 507 and
nothing partial, and the server recovers when space returns; restarts are
idempotent; kill -9 at random moments under mixed operations keeps every
acknowledged effect.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import uuid

import httpx
import pytest

from stream_format.layout import Layout
from testkit import needs
from testkit.stream_reads import read_all, stream_state

pytestmark = pytest.mark.processes

ROUNDS = int(os.environ.get("CRASH_ROUNDS", "3"))
BIN = {"Content-Type": "application/octet-stream"}


@pytest.mark.parametrize("stage", ["segments", "fsync", "wal", "commit"])
def test_crash_at_each_step_of_a_batch(server_factory, tmp_path, stage):
    data = tmp_path / "data"
    srv = server_factory(data_dir=data, env={"DS_FAULT": f"crash:{stage}:4"}).start()
    url = f"{srv.base}steps"
    assert httpx.put(url, headers=BIN).status_code == 201  # batch 1
    assert httpx.post(url, headers=BIN, content=b"one;").status_code == 204  # batch 2
    assert httpx.post(url, headers=BIN, content=b"two;").status_code == 204  # batch 3
    with pytest.raises(httpx.HTTPError):
        httpx.post(url, headers=BIN, content=b"three;")  # batch 4: the process dies
    srv.proc.wait(timeout=10)
    assert srv.proc.returncode == 137
    srv = server_factory(data_dir=data).start()
    got = read_all(f"{srv.base}steps")
    # Before its WAL frame is written the batch is gone; once the frame is
    # flushed it is there, whole. In between (written, not flushed) a process
    # crash keeps the page cache, so it is there too; a power cut might not.
    assert got in (b"one;two;", b"one;two;three;")
    if stage == "segments":
        assert got == b"one;two;"
    if stage in ("wal", "commit"):
        assert got == b"one;two;three;"
    assert httpx.post(f"{srv.base}steps", headers=BIN, content=b"four;").status_code == 204
    assert read_all(f"{srv.base}steps") == got + b"four;"


def test_failed_flush_fails_closed(server_factory, tmp_path):
    data = tmp_path / "data"
    srv = server_factory(data_dir=data, env={"DS_FAULT": "eio:fsync:3"}).start()
    url = f"{srv.base}eio"
    httpx.put(url, headers=BIN)
    assert httpx.post(url, headers=BIN, content=b"kept;").status_code == 204
    r = httpx.post(url, headers=BIN, content=b"lost;")
    assert r.status_code == 503 and "failed closed" in r.text
    # Never retried as if it had worked: every later write is refused too.
    assert httpx.post(url, headers=BIN, content=b"later;").status_code == 503
    assert httpx.put(f"{srv.base}other", headers=BIN).status_code == 503
    ready = httpx.get(f"{srv.url}/readyz")
    assert ready.status_code == 503 and "failed closed" in ready.text
    metrics = httpx.get(f"{srv.url}/metrics").text
    assert "durable_streams_storage_failed 1.0" in metrics
    assert read_all(url) == b"kept;"  # reads go on
    assert "storage failed closed" in srv.log()
    srv.kill()
    srv = server_factory(data_dir=data).start()
    got = read_all(f"{srv.base}eio")
    assert got in (b"kept;", b"kept;lost;")  # the unacknowledged write: whole or absent


def test_corrupt_record_is_refused_and_other_streams_served(server_factory, tmp_path):
    data = tmp_path / "data"
    srv = server_factory(data_dir=data).start()
    bad, good = f"{srv.base}bad", f"{srv.base}good"
    for url in (bad, good):
        httpx.put(url, headers=BIN)
        for i in range(5):  # 2 KiB: past what data format 5 keeps in LMDB, a file
            httpx.post(url, headers=BIN, content=bytes([65 + i]) * 400)
    srv.stop()
    seg = Layout(data).segment_path(1)
    raw = bytearray(seg.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a record in the middle
    seg.write_bytes(bytes(raw))
    srv = server_factory(data_dir=data).start()
    r = httpx.get(f"{srv.base}bad", params={"offset": "-1"})
    assert r.status_code == 500 and "checksum" in r.text
    assert read_all(f"{srv.base}good") == b"".join(bytes([65 + i]) * 400 for i in range(5))
    assert httpx.get(f"{srv.url}/readyz").status_code == 200


def snapshot(srv, paths) -> dict:
    return {p: stream_state(f"{srv.base}{p}") for p in paths}


def test_five_restarts_change_nothing(server_factory, tmp_path):
    data = tmp_path / "data"
    srv = server_factory(data_dir=data).start()
    paths = ["r/bin", "r/json", "r/closed", "r/fork", "r/gone"]
    httpx.put(f"{srv.base}r/bin", headers=BIN, content=b"x" * 5000)
    httpx.put(f"{srv.base}r/json", headers={"Content-Type": "application/json"}, content=b"[1,2,3]")
    httpx.put(f"{srv.base}r/closed", headers=BIN | {"Stream-Closed": "true"}, content=b"end")
    httpx.put(f"{srv.base}r/fork", headers={"Stream-Forked-From": "/v1/stream/r/bin"})
    httpx.post(f"{srv.base}r/fork", headers=BIN, content=b"own")
    httpx.put(f"{srv.base}r/gone", headers=BIN)
    httpx.delete(f"{srv.base}r/gone")
    before = snapshot(srv, paths)
    srv.kill()  # the first restart recovers from the WAL
    for _ in range(5):
        srv = server_factory(data_dir=data).start()
        assert snapshot(srv, paths) == before
        srv.stop()


def _mount(kind: str, where, size_mb: int):
    if kind == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)]
    else:
        img = where.parent / "disk.img"
        subprocess.run(["truncate", "-s", f"{size_mb}M", str(img)], check=True)
        subprocess.run(["mkfs.ext4", "-q", str(img)], check=True)
        cmd = ["mount", "-o", "loop", str(img), str(where)]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])
def test_disk_full_gives_507_and_recovers_when_space_returns(server_factory, tmp_path, fs):
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (CI runs as root)")
    if fs == "ext4" and needs.absent("mkfs.ext4"):
        needs.missing("mkfs.ext4 not installed: Debian's e2fsprogs (make system-deps)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = _mount(fs, mnt, 24)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount {fs} here: {mounted.stderr.strip()}")
    try:
        srv = server_factory(data_dir=mnt / "data").start()
        url = f"{srv.base}full"
        httpx.put(url, headers=BIN)
        filler = mnt / "filler"
        free = shutil.disk_usage(mnt).free
        with open(filler, "wb") as fh:
            fh.write(b"\0" * max(0, free - 3 * 1024 * 1024))
        acked = b""
        status = 204
        for _ in range(200):
            body = uuid.uuid4().hex.encode() * 2048  # 64 KiB
            status = httpx.post(url, headers=BIN, content=body, timeout=30).status_code
            if status != 204:
                break
            acked += body
        assert status == 507, status
        assert httpx.post(url, headers=BIN, content=b"y" * 65536).status_code == 507
        assert read_all(url) == acked  # nothing partial became visible
        filler.unlink()
        r = httpx.post(url, headers=BIN, content=b"after")
        assert r.status_code == 204, r.text  # no restart needed
        assert read_all(url) == acked + b"after"
        srv.stop()
        srv = server_factory(data_dir=mnt / "data").start()
        assert read_all(f"{srv.base}full") == acked + b"after"
        srv.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def _mixed_load(srv, oracle: dict, stop: asyncio.Event) -> None:
    """Appends, producer appends, closes, forks and deletes, recording what was acknowledged."""
    async with httpx.AsyncClient(timeout=10) as c:

        async def worker(n: int) -> None:
            rng = random.Random(n)
            while not stop.is_set():
                name = f"m/{n}-{rng.randrange(4)}"
                url = f"{srv.base}{name}"
                op = rng.random()
                st = oracle.setdefault(
                    name, {"state": "absent", "data": b"", "maybe": b"", "seq": 0}
                )
                try:
                    if st["state"] == "absent":
                        r = await c.put(url, headers=BIN)
                        if r.status_code == 201:
                            st.update(state="open", data=b"", maybe=b"", seq=0)
                    elif st["state"] == "closed" or op < 0.05:
                        r = await c.delete(url)
                        if r.status_code == 204:
                            st.update(state="absent")
                    elif op < 0.10:
                        r = await c.post(url, headers={"Stream-Closed": "true"})
                        if r.status_code == 204:
                            st.update(state="closed")
                    elif op < 0.15:
                        fork = f"{srv.base}{name}-fork-{uuid.uuid4().hex[:6]}"
                        r = await c.put(fork, headers={"Stream-Forked-From": f"/v1/stream/{name}"})
                        if r.status_code == 201:
                            oracle.setdefault("_forks", []).append(
                                (fork.rsplit("/v1/stream/", 1)[1], st["data"])
                            )
                    else:
                        body = f"<{n}:{rng.randrange(10**9)}>".encode()
                        st["maybe"] = body
                        h = BIN | {
                            "Producer-Id": f"p{n}",
                            "Producer-Epoch": "0",
                            "Producer-Seq": str(st["seq"]),
                        }
                        r = await c.post(url, headers=h, content=body)
                        if r.status_code == 200:
                            st["data"] += body
                            st["seq"] += 1
                        st["maybe"] = b""
                except httpx.HTTPError:
                    return

        tasks = [asyncio.create_task(worker(n)) for n in range(8)]
        await asyncio.sleep(random.uniform(0.3, 1.0))
        srv.kill()
        stop.set()
        await asyncio.gather(*tasks)


# Each round starts two servers and checks every stream: 10 to 20 s on a loaded 2-core
# machine (50 rounds took 1,052 s beside the whole suite), so the long profile's rounds
# ran past the suite's 300 s and failed on the timeout, not on a finding.
@pytest.mark.timeout(max(300, 40 * ROUNDS))
def test_kill9_during_mixed_operations(server_factory, tmp_path):
    data = tmp_path / "data"
    oracle: dict = {}
    for _ in range(ROUNDS):
        srv = server_factory(data_dir=data).start()
        asyncio.run(_mixed_load(srv, oracle, asyncio.Event()))
        srv = server_factory(data_dir=data).start()
        for name, st in list(oracle.items()):
            if name == "_forks":
                continue
            h = httpx.head(f"{srv.base}{name}")
            if st["state"] == "absent":
                # Deleted (acknowledged) or never created: gone, or a create/delete
                # whose reply was lost; then adopt what the server says.
                if h.status_code == 200:
                    st.update(state="open", data=read_all(f"{srv.base}{name}"), seq=0)
                continue
            assert h.status_code in (200, 404, 410), h.status_code
            if h.status_code != 200:  # an unacknowledged delete did land
                st["state"] = "absent"
                continue
            body = read_all(f"{srv.base}{name}")
            assert body in (st["data"], st["data"] + st["maybe"]), name
            assert int(h.headers["stream-next-offset"].split("_")[1]) == len(body)
            if st["state"] == "closed":
                assert h.headers.get("stream-closed") == "true", name
            elif h.headers.get("stream-closed") == "true":
                st["state"] = "closed"
            if body != st["data"]:
                st["seq"] += 1
            st["data"] = body
            st["maybe"] = b""
        for fork, inherited in oracle.get("_forks", []):
            r = httpx.head(f"{srv.base}{fork}")
            if r.status_code == 200:
                assert read_all(f"{srv.base}{fork}").startswith(inherited)
        srv.stop()
