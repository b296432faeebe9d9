"""The replica-set harness itself (testkit.replicaset, testkit.kube_serve), real processes.

These tests hold whether or not the server replicates: they check what the
harness promises (its own API server with compare-and-swap over real HTTP,
the state file's shape, restart from the state file, nothing left behind),
so that the failover tests built on it prove what they claim.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from testkit import wait_for
from testkit.replicaset import ROOT, ReplicaSet, runs
from testkit.servers import env_with, http_status

pytestmark = pytest.mark.processes

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


def lease(name: str, holder: str) -> dict:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


def gone(pid: int) -> bool:
    """No process with this pid, or only a zombie (reaped by init, not by us)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testkit.replicaset", *args],
        cwd=ROOT,
        env=env_with(pythonpath=ROOT),
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def api_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    url_file = tmp_path / "api-url"
    with open(tmp_path / "api.log", "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testkit.kube_serve",
                "--port",
                "0",
                "--url-file",
                str(url_file),
            ],
            cwd=ROOT,
            env=env_with(pythonpath=ROOT),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(url_file.exists, timeout=60, message="the API server's URL file")
        yield proc, url_file.read_text().strip()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_the_api_server_process_serves_leases_with_compare_and_swap(api_process):
    """A write naming a stale resourceVersion is 409 and changes nothing, over real HTTP."""
    proc, api = api_process
    with httpx.Client(base_url=api, timeout=10) as c:
        created = c.post(LEASES, json=lease("rs", "ds-0"))
        assert created.status_code == 201, created.text
        first = created.json()["metadata"]["resourceVersion"]
        again = c.post(LEASES, json=lease("rs", "ds-1"))
        assert again.status_code == 409  # creation is a CAS too: AlreadyExists

        taken = lease("rs", "ds-1")
        taken["metadata"]["resourceVersion"] = first
        won = c.put(f"{LEASES}/rs", json=taken)
        assert won.status_code == 200, won.text
        assert won.json()["spec"]["holderIdentity"] == "ds-1"
        assert won.json()["metadata"]["resourceVersion"] != first

        late = lease("rs", "ds-2")
        late["metadata"]["resourceVersion"] = first  # read before ds-1's write: stale
        lost = c.put(f"{LEASES}/rs", json=late)
        assert lost.status_code == 409, lost.text
        assert lost.json()["reason"] == "Conflict"
        after = c.get(f"{LEASES}/rs").json()
        assert after["spec"]["holderIdentity"] == "ds-1"
        assert after["metadata"]["resourceVersion"] == won.json()["metadata"]["resourceVersion"]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0  # stops cleanly when told, as down() tells it


def test_up_writes_the_state_file_restart_and_down_leave_nothing_behind(tmp_path):
    """The command line: the documented state file, a restart from it, a clean down."""
    state_file = tmp_path / "rs.json"
    up = cli("up", "--replicas", "2", "--state-file", str(state_file))
    assert up.returncode == 0, up.stderr
    try:
        state = json.loads(state_file.read_text())
        assert set(state) >= {"api", "servers"}
        assert len(state["servers"]) == 2
        assert http_status(urlsplit(state["api"]).port, f"{LEASES}") == 200
        for s in state["servers"]:
            assert set(s) >= {"name", "url", "pid", "data_dir"}
            parts = urlsplit(s["url"])
            assert (parts.scheme, parts.hostname, parts.path) == ("http", "127.0.0.1", "")
            assert Path(s["data_dir"]).is_dir()
            assert http_status(parts.port, "/healthz") == 200
            assert runs(s["pid"], s["command"])
        names = [s["name"] for s in state["servers"]]
        assert len(set(names)) == 2
        assert len({s["data_dir"] for s in state["servers"]}) == 2
        assert len({s["url"] for s in state["servers"]}) == 2

        # kill -9 one server by hand, then restart it from what the state file records.
        victim = state["servers"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: gone(victim["pid"]), message="the killed server to go")
        assert http_status(urlsplit(victim["url"]).port, "/healthz") is None
        restarted = cli("restart", victim["name"], "--state-file", str(state_file))
        assert restarted.returncode == 0, restarted.stderr
        after = json.loads(state_file.read_text())["servers"][0]
        assert after["pid"] != victim["pid"]
        assert (after["url"], after["data_dir"]) == (victim["url"], victim["data_dir"])
        assert http_status(urlsplit(after["url"]).port, "/healthz") == 200
        # Restarting a server that runs is refused, and starts nothing.
        twice = cli("restart", victim["name"], "--state-file", str(state_file))
        assert twice.returncode == 1 and "still running" in twice.stderr
    finally:
        down = cli("down", "--state-file", str(state_file))
    assert down.returncode == 0, down.stderr
    state = json.loads(state_file.read_text())
    pids = [s["pid"] for s in state["servers"]] + [state["api_pid"]]
    for pid in pids:
        assert gone(pid), f"pid {pid} still runs after down"
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # nor anything it started in its session
    for s in state["servers"]:
        assert http_status(urlsplit(s["url"]).port, "/healthz") is None


def test_the_python_api_kills_restarts_and_stops(tmp_path):
    rs = ReplicaSet.up(2, tmp_path / "rs")
    try:
        assert [s.name for s in rs.servers] == ["ds-0", "ds-1"]
        assert json.loads(rs.state_file.read_text())["servers"][1]["pid"] == rs.servers[1].pid
        old = rs.servers[1].pid
        rs.kill("ds-1")  # SIGKILL: returns once it is gone
        assert not rs.alive("ds-1") and gone(old)
        rs.restart("ds-1")
        assert rs.alive("ds-1") and rs.servers[1].pid != old
        assert json.loads(rs.state_file.read_text())["servers"][1]["pid"] == rs.servers[1].pid
        with pytest.raises(KeyError, match="no server 'ds-7'"):
            rs.status("ds-7")
    finally:
        rs.down()
    assert all(gone(s.pid) for s in rs.servers) and gone(rs.api_pid)
    rs.down()  # a second down finds nothing to stop, and says nothing


def test_down_never_signals_a_process_the_state_file_did_not_start(tmp_path):
    """A stale state file whose pid now belongs to something else: that process lives on."""
    rs = ReplicaSet.up(1, tmp_path / "rs")
    rs.down()
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = json.loads(rs.state_file.read_text())
        state["servers"][0]["pid"] = bystander.pid  # as if the pid had been recycled
        state["api_pid"] = bystander.pid
        rs.state_file.write_text(json.dumps(state))
        down = cli("down", "--state-file", str(rs.state_file), "--grace", "1")
        assert down.returncode == 0, down.stderr
        assert bystander.poll() is None, "down killed a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()


def test_up_refuses_a_bad_set_and_starts_nothing(tmp_path):
    state_file = tmp_path / "rs.json"
    for args, message in (
        (["--replicas", "6"], "1 to 5 servers"),
        (["--lease", "no-namespace"], "namespace/name"),
    ):
        r = cli("up", "--state-file", str(state_file), *args)
        assert r.returncode == 1 and message in r.stderr, r.stderr
        assert not state_file.exists()
    r = cli("up", "--state-file", str(state_file), "--set", "oops")
    assert r.returncode == 2 and "NAME=VALUE" in r.stderr
