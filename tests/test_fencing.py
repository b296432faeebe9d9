"""Fencing a server at run time through its fence file (stream_server/fencing.py): the
process stays (same PID, alive), the storage is closed and left untouched, every request
but the liveness probe gets 503, and lifting the fence serves the same data again.

A replica set's pods fenced under the operator: e2e/test_operator_lifecycle.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from stream_server.fencing import FENCED_ANNOTATION, LIST_FILE, parse_annotations, read_fence
from testkit import wait_for
from testkit.server_process import ServerProcess
from testkit.servers import Child, env_with, http_status, stream_server_command
from testkit.worker_counts import WORKER_COUNTS

pytestmark = pytest.mark.processes

TEXT = {"content-type": "text/plain"}


def files_state(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its content's digest and modification time (ns)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def write_annotations(path: Path, annotations: dict[str, str]) -> None:
    """As the kubelet writes a downward API file: ``key="value"`` lines, replaced whole."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f'{k}="{v}"\n' for k, v in sorted(annotations.items())))
    tmp.replace(path)


def test_the_annotations_file_is_read_as_the_downward_api_writes_it(tmp_path: Path) -> None:
    text = (
        'kubectl.kubernetes.io/restartedAt="2026-01-01T00:00:00Z"\n'
        'note="a \\"quoted\\" value\\nover two lines"\n'
        f'{FENCED_ANNOTATION}="true"\n'
        "garbage line\n"
    )
    parsed = parse_annotations(text)
    assert parsed[FENCED_ANNOTATION] == "true"
    assert parsed["note"] == 'a "quoted" value\nover two lines'
    assert "garbage line" not in parsed
    path = tmp_path / "annotations"
    assert read_fence(str(path)) is None  # not there: the mode stays as it is
    write_annotations(path, {FENCED_ANNOTATION: "false"})
    assert read_fence(str(path)) is False
    write_annotations(path, {FENCED_ANNOTATION: "true"})
    assert read_fence(str(path)) is True


@WORKER_COUNTS
def test_a_server_fenced_at_run_time_keeps_its_process_and_leaves_its_storage(
    tmp_path: Path, workers: str
) -> None:
    """With workers, the writer's fence stops them first; the fenced process serves
    alone, and the lifted fence brings them back."""
    fence = tmp_path / "annotations"
    write_annotations(fence, {"other": "x"})
    env = {"DS_FENCE_FILE": str(fence), "DS_WORKERS": workers}
    srv = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(timeout=10) as http:
            url = srv.base + "fenced/one"
            assert http.put(url, headers=TEXT).status_code == 201
            for i in range(20):
                assert http.post(url, content=f"line {i}\n", headers=TEXT).status_code == 204
            pid = srv.proc.pid

            write_annotations(fence, {"other": "x", FENCED_ANNOTATION: "true"})
            wait_for(
                lambda: _fenced(http, srv),
                timeout=30,
                message=lambda: f"the server is not fenced:\n{srv.log()[-3000:]}",
            )
            before = files_state(srv.data_dir)
            assert srv.proc.poll() is None and srv.proc.pid == pid  # the same process
            assert http.get(srv.url + "/healthz").status_code == 200  # liveness passes
            refused = http.post(url, content="not written\n", headers=TEXT)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "FENCED"
            assert http.get(url, params={"offset": "-1"}).status_code == 503
            assert http.put(srv.base + "fenced/two").status_code == 503
            assert files_state(srv.data_dir) == before  # nothing written while fenced

            write_annotations(fence, {"other": "x"})
            wait_for(lambda: http_status(srv.port, "/readyz") == 200, timeout=30)
            assert srv.proc.pid == pid
            r = http.get(url, params={"offset": "-1"})
            assert r.status_code == 200
            assert r.content == b"".join(f"line {i}\n".encode() for i in range(20))
            assert http.post(url, content="after\n", headers=TEXT).status_code == 204
            assert http.head(srv.base + "fenced/two").status_code == 404
    finally:
        assert srv.stop() == 0


def _fenced(http: httpx.Client, srv: ServerProcess) -> bool:
    try:
        r = http.get(srv.url + "/readyz")
    except httpx.HTTPError:
        return False
    return r.status_code == 503 and r.json().get("fenced") is True


def test_a_server_started_fenced_does_not_open_its_data_directory(tmp_path: Path) -> None:
    fence = tmp_path / "annotations"
    write_annotations(fence, {FENCED_ANNOTATION: "true"})
    srv = _start_fenced(tmp_path, fence)
    try:
        assert http_status(srv.port, "/readyz") == 503
        assert not srv.data_dir.exists()  # no layout made, no recovery run
        write_annotations(fence, {})
        wait_for(lambda: http_status(srv.port, "/readyz") == 200, timeout=30)
        assert any(srv.data_dir.iterdir())  # an ordinary server now: its layout made
    finally:
        assert srv.stop() == 0


def write_list(directory: Path, pod: str, names: list[str] | str) -> None:
    """The operator's list and the pod's name, as the projected volume holds them."""
    (directory / "pod-name").write_text(pod)
    tmp = directory / ".list.tmp"
    tmp.write_text(names if isinstance(names, str) else json.dumps(names))
    tmp.replace(directory / LIST_FILE)


def test_a_pod_without_the_annotation_is_fenced_by_the_operators_list(tmp_path: Path) -> None:
    """A pod made after the fence (deleted, recreated) has no annotation yet: the list
    beside the fence file decides; once the operator wrote one, the annotation does."""
    path = tmp_path / "annotations"
    write_annotations(path, {"other": "x"})
    assert read_fence(str(path)) is False  # no list (no ConfigMap): not fenced
    write_list(tmp_path, "ev-1", ["ev-1"])
    assert read_fence(str(path)) is True
    write_list(tmp_path, "ev-1", ["*"])
    assert read_fence(str(path)) is True
    write_list(tmp_path, "ev-1", ["ev-0"])
    assert read_fence(str(path)) is False
    write_list(tmp_path, "ev-1", "not json")
    assert read_fence(str(path)) is None  # unreadable: the mode stays
    write_list(tmp_path, "ev-1", ["ev-1"])
    write_annotations(path, {FENCED_ANNOTATION: "false"})  # lifted: before the list's refresh
    assert read_fence(str(path)) is False
    write_annotations(path, {FENCED_ANNOTATION: "true"})
    write_list(tmp_path, "ev-1", [])
    assert read_fence(str(path)) is True


def test_a_server_the_list_names_starts_fenced_and_follows_the_list(tmp_path: Path) -> None:
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    fence = podinfo / "annotations"
    write_annotations(fence, {})
    write_list(podinfo, "ev-0", ["ev-0"])
    srv = _start_fenced(tmp_path, fence)
    try:
        assert http_status(srv.port, "/readyz") == 503
        assert not srv.data_dir.exists()  # never opened
        write_list(podinfo, "ev-0", [])  # the kubelet's refresh of the ConfigMap's file
        wait_for(lambda: http_status(srv.port, "/readyz") == 200, timeout=30)
        assert any(srv.data_dir.iterdir())
    finally:
        assert srv.stop() == 0


def _start_fenced(tmp_path: Path, fence: Path) -> ServerProcess:
    """A server started fenced: alive (``/healthz``), never ready, so not through
    ``ServerProcess.start``, which waits for ``/readyz``."""
    srv = ServerProcess(tmp_path / "data", env={"DS_FENCE_FILE": str(fence)})
    srv.child = Child(
        "server",
        stream_server_command(srv.port, srv.data_dir),
        srv.log_path,
        env=env_with(srv.env),
    )
    srv.child.start(lambda: http_status(srv.port, "/healthz") == 200)
    return srv
