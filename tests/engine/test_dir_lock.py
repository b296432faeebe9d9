"""One writer per data directory (engine/dir_lock.py), with real processes.

Before the lock, two servers started on one directory both served and both
acknowledged: stream ``a`` appended on one and ``b`` on the other both read
``b``'s bytes afterwards, and a restart recovered the wrong data as undamaged.
Now the second one is refused at once (exit status 2, naming the directory and
the holder), as are ``recover`` and an engine opened in another process; a lock
whose holder was killed is taken over; two starts racing each other leave one.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from stream_format.layout import LOCK_FILE
from stream_server.engine import Engine, dir_lock
from testkit import wait_for
from testkit.server_process import ServerProcess
from testkit.servers import free_port, stream_server_command

pytestmark = pytest.mark.processes

TEXT = {"Content-Type": "text/plain"}
# Long enough for any loaded machine: a refused start answers in well under it.
REFUSED_WITHIN = 60


def append_three(srv: ServerProcess, path: str, tag: str) -> None:
    with httpx.Client(base_url=srv.base, timeout=30) as c:
        assert c.put(path, headers=TEXT).status_code == 201
        for i in (1, 2, 3):
            assert c.post(path, content=f"{tag}{i};", headers=TEXT).status_code == 204


def read(srv: ServerProcess, path: str) -> bytes:
    r = httpx.get(f"{srv.base}{path}?offset=-1", timeout=30)
    assert r.status_code == 200, r.text
    return r.content


def second_start(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = stream_server_command(free_port(), data_dir, "--workers", "1", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=REFUSED_WITHIN)


def test_a_second_server_on_the_directory_is_refused_and_the_first_keeps_its_data(
    server_factory, tmp_path
):
    data = tmp_path / "data"
    first = server_factory("--workers", "1", data_dir=data).start()
    append_three(first, "a", "A")

    refused = second_start(data)

    assert refused.returncode == 2, refused.stderr[-2000:]
    said = refused.stderr
    assert str(data) in said and f"process {first.proc.pid}" in said, said[-2000:]
    assert f"on host {socket.gethostname()}" in said, said[-2000:]
    assert "Traceback" not in said, said[-3000:]
    append_three(first, "b", "B")
    assert read(first, "a") == b"A1;A2;A3;"
    assert read(first, "b") == b"B1;B2;B3;"


def test_a_server_with_workers_holds_the_lock_in_its_writer(server_factory, tmp_path):
    data = tmp_path / "data"
    first = server_factory("--workers", "2", data_dir=data).start()

    refused = second_start(data)

    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"process {first.proc.pid}" in refused.stderr, refused.stderr[-2000:]


def test_recover_refuses_a_live_directory_and_changes_nothing(server_factory, tmp_path):
    data = tmp_path / "data"
    first = server_factory("--workers", "1", data_dir=data).start()
    append_three(first, "a", "A")
    before = sorted((p.relative_to(data), p.stat().st_size) for p in data.rglob("*.log"))

    recovered = subprocess.run(
        [sys.executable, "-m", "stream_server.recover", str(data)],
        capture_output=True,
        text=True,
        timeout=REFUSED_WITHIN,
    )

    assert recovered.returncode == 2, recovered.stderr
    assert "in use by" in recovered.stderr and "Traceback" not in recovered.stderr
    assert sorted((p.relative_to(data), p.stat().st_size) for p in data.rglob("*.log")) == before
    assert read(first, "a") == b"A1;A2;A3;"


def test_an_engine_in_another_process_is_refused(server_factory, tmp_path):
    data = tmp_path / "data"
    first = server_factory("--workers", "1", data_dir=data).start()

    with pytest.raises(dir_lock.DataDirInUse, match=f"process {first.proc.pid} "):
        Engine(data).open()

    assert read_status(first) == 200


def read_status(srv: ServerProcess) -> int:
    return httpx.get(f"{srv.url}/readyz", timeout=30).status_code


def test_the_lock_of_a_killed_server_is_taken_over(server_factory, tmp_path):
    data = tmp_path / "data"
    first = server_factory("--workers", "1", data_dir=data).start()
    append_three(first, "a", "A")
    first.kill()
    left = json.loads((data / LOCK_FILE).read_text())
    assert left["pid"] == first.proc.pid  # the dead holder's text is still there

    second = server_factory("--workers", "1", data_dir=data).start()

    assert read(second, "a") == b"A1;A2;A3;"
    now = json.loads((data / LOCK_FILE).read_text())
    assert now["pid"] == second.proc.pid


def test_two_starts_racing_leave_exactly_one_server(tmp_path):
    data = tmp_path / "data"
    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            stream_server_command(port, data, "--workers", "1"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for port in ports
    ]
    try:
        # One of them exits 2; wait for it, whichever it is.
        refused = wait_for_exit(procs)
        winner = procs[1 - procs.index(refused)]
        assert refused.returncode == 2, refused.stderr.read() if refused.stderr else ""
        assert winner.poll() is None
        assert f"process {winner.pid} " in (refused.stderr.read() if refused.stderr else "")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
            if p.stderr:
                p.stderr.close()


def wait_for_exit(procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """The first of ``procs`` to exit."""
    wait_for(lambda: any(p.poll() is not None for p in procs), timeout=REFUSED_WITHIN)
    return next(p for p in procs if p.poll() is not None)


def test_in_one_process_the_lock_is_counted_and_the_last_release_frees_it(tmp_path):
    data = tmp_path / "data"
    dir_lock.acquire(data)
    dir_lock.acquire(data)  # the server, then its engine: one process, no conflict
    dir_lock.release(data)
    assert held_elsewhere(data)  # still held after one of the two releases
    dir_lock.release(data)
    assert not held_elsewhere(data)


def held_elsewhere(data: Path) -> bool:
    """Whether another process is refused the lock now."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from stream_server.engine import dir_lock\n"
            "try:\n dir_lock.acquire(Path(sys.argv[1]))\nexcept dir_lock.DataDirInUse:\n"
            " sys.exit(3)",
            str(data),
        ],
        timeout=REFUSED_WITHIN,
    )
    assert probe.returncode in (0, 3)
    return probe.returncode == 3
