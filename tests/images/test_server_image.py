"""The server image, run as the operator's pod runs it: non-root, its volume, its probe, its stop.

The container gets what the rendered pod spec gives it (``args: [serve]``,
read-only root file system with a writable /tmp, all capabilities dropped,
no privilege escalation, the data volume owned by uid 10001 as fsGroup
makes it) and is stopped as the kubelet stops it: SIGTERM, then SIGKILL
when the pod's termination grace period (the operator's default) runs out.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from stream_operator.api.spec import with_defaults
from testkit import wait_for
from testkit.containers import PODMAN_NEEDED
from testkit.images import SERVER_UID, report
from testkit.server_process import raw_get, read_until_closed

pytestmark = [pytest.mark.processes, PODMAN_NEEDED, pytest.mark.timeout(1800)]

GRACE = with_defaults({}).lifecycle.termination_grace_period_seconds
TEXT = {"Content-Type": "text/plain"}
# Readers that would hold the server far longer than its grace period, were they waited for.
LIVE = str(GRACE * 4)
# tini passes on how the server ended: 0, or 128 + SIGTERM when uvicorn re-raises the
# signal it handled. 137 would be the SIGKILL at the end of the grace period.
CLEAN_EXITS = (0, 128 + 15)


def test_runs_as_non_root_writes_its_volume_and_drains_on_sigterm(serve, podman, tmp_path):
    data = podman.own(tmp_path / "data", SERVER_UID)
    srv = serve(data, DS_LONG_POLL_TIMEOUT=LIVE, DS_SSE_RECONNECT_INTERVAL=LIVE)
    assert srv.box.exec("id", "-u").strip() == str(SERVER_UID)
    assert srv.box.exec("id", "-g").strip() == str(SERVER_UID)

    with httpx.Client(base_url=srv.base, timeout=10) as c:
        assert c.put("log", headers=TEXT, content=b"first;").status_code == 201
        assert c.post("log", headers=TEXT, content=b"second;").status_code == 204
    # The server's files are on the host's volume, every one made by the container's user.
    assert (data / "FORMAT").is_file() and (data / "wal").is_dir(), list(data.iterdir())
    assert srv.box.exec("find", "/data", "-not", "-user", str(SERVER_UID)) == ""

    # Readers waiting when the stop begins: the server must end them itself, not wait.
    port = srv.port
    sse = raw_get(port, "/v1/stream/log?offset=now&live=sse", timeout=GRACE + 30)
    long_poll = raw_get(port, "/v1/stream/log?offset=now&live=long-poll", timeout=GRACE + 30)
    time.sleep(0.5)  # both requests are in the server, waiting
    took = srv.box.stop(grace=GRACE)
    report(f"server container stop (SIGTERM, 2 live readers): {took:.2f} s, grace {GRACE} s")
    print(f"\nserver container stopped in {took:.2f} s (grace period {GRACE} s)")

    log = srv.box.logs()
    assert srv.box.exit_code() in CLEAN_EXITS, log
    assert took < GRACE, f"stop took {took:.1f} s, the grace period is {GRACE} s:\n{log}"
    head = read_until_closed(long_poll).split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 204") and b"stream-up-to-date: true" in head, head
    sse_reply = read_until_closed(sse)
    assert sse_reply.startswith(b"HTTP/1.1 200") and sse_reply.endswith(b"0\r\n\r\n"), sse_reply
    # JSON log lines (DS_LOG_FORMAT=json in the image), ending in a clean stop.
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["msg"].startswith("Finished server process"), log
    assert any(x["msg"] == "stopped cleanly" for x in lines), log
    assert "Traceback" not in log, log


def test_keeps_its_data_across_a_container_restart(serve, podman, tmp_path):
    """A pod replaced: a new container from the image on the same volume."""
    data = podman.own(tmp_path / "data", SERVER_UID)
    first = serve(data)
    with httpx.Client(base_url=first.base, timeout=10) as c:
        assert c.put("kept", headers=TEXT, content=b"a").status_code == 201
        for part in (b"b", b"c"):
            assert c.post("kept", headers=TEXT, content=part).status_code == 204
        tail = c.head("kept").headers["Stream-Next-Offset"]
    first.box.stop(grace=GRACE)
    first.box.remove()

    second = serve(data)
    with httpx.Client(base_url=second.base, timeout=10) as c:
        r = c.get("kept", params={"offset": "-1"})
        assert (r.status_code, r.content) == (200, b"abc")
        assert r.headers["Stream-Next-Offset"] == tail
        assert c.post("kept", headers=TEXT, content=b"d").status_code == 204
        assert c.get("kept", params={"offset": "-1"}).content == b"abcd"
    wait_for(lambda: second.box.running(), message="the second container still running")
