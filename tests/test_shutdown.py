"""SIGTERM with live readers connected: the pod must stop well within its grace period.

Uvicorn waits for open connections before it runs the app's shutdown, so a
long-poll or SSE reader that the server does not end itself would hold the
process for the whole graceful-shutdown timeout, and then be cancelled with a
traceback in the log. These tests hold readers far longer than the time the
process is given to exit.
"""

from __future__ import annotations

import signal
import socket
import time

import httpx
import pytest

from testkit import wait_for
from testkit.server_process import live_gauge, raw_get, read_until_closed

pytestmark = pytest.mark.processes

TEXT = {"Content-Type": "text/plain"}
# Far longer than the exit is allowed to take: an exit that waits for a reader fails.
LIVE_SECONDS = "60"
EXIT_WITHIN = 10.0


def dechunk(body: bytes) -> bytes:
    """A chunked body's content; AssertionError unless it ends with the last chunk."""
    out = b""
    while True:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", body
            return out
        out += rest[:size]
        body = rest[size + 2 :]


def test_sigterm_ends_live_readers_at_once(server_factory):
    srv = server_factory(
        "--long-poll-timeout", LIVE_SECONDS, "--sse-reconnect-interval", LIVE_SECONDS,
    ).start()  # fmt: skip
    assert httpx.put(f"{srv.base}s", headers=TEXT, content=b"hello").status_code == 201
    sse = raw_get(srv.port, "/v1/stream/s?offset=now&live=sse", timeout=EXIT_WITHIN + 5)
    long_poll = raw_get(srv.port, "/v1/stream/s?offset=now&live=long-poll", timeout=EXIT_WITHIN + 5)
    gone = raw_get(srv.port, "/v1/stream/s?offset=now&live=sse", timeout=EXIT_WITHIN + 5)
    wait_for(lambda: live_gauge(srv, "sse") == 2 and live_gauge(srv, "long-poll") == 1, timeout=10)
    gone.close()  # this reader's client goes away: its slot is freed without waiting
    wait_for(lambda: live_gauge(srv, "sse") == 1, timeout=5)

    assert srv.proc is not None
    started = time.monotonic()
    srv.proc.terminate()
    sse_reply = read_until_closed(sse)
    long_poll_reply = read_until_closed(long_poll)
    status = srv.proc.wait(timeout=EXIT_WITHIN + 20)
    took = time.monotonic() - started
    print(f"\nexit after SIGTERM, with an SSE and a long-poll reader waiting: {took:.2f} s")

    log = srv.log()
    assert took < EXIT_WITHIN, f"exit took {took:.1f} s:\n{log}"
    assert status == 0, log
    # The long-poll is answered as on its timeout: 204, up to date, with a cursor.
    head = long_poll_reply.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 204"), long_poll_reply
    assert b"stream-up-to-date: true" in head
    assert b"stream-next-offset: " in head and b"stream-cursor: " in head
    # The SSE stream ends with a control event, and its chunked body is terminated.
    assert sse_reply.startswith(b"HTTP/1.1 200"), sse_reply
    events = dechunk(sse_reply.split(b"\r\n\r\n", 1)[1]).split(b"\n\n")
    assert events[-1] == b"" and events[-2].startswith(b"event: control\n"), sse_reply
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert "stopped cleanly" in log, log


def test_sigterm_does_not_wait_for_a_request_that_never_finishes(server_factory):
    """The backstop: a connection still busy shortly after shutdown began is reset, so its
    request ends before uvicorn would cancel it (and log the cancellation)."""
    srv = server_factory("--body-timeout", LIVE_SECONDS).start()
    assert httpx.put(f"{srv.base}s", headers=TEXT).status_code == 201
    stalled = socket.create_connection(("127.0.0.1", srv.port), timeout=EXIT_WITHIN + 5)
    stalled.sendall(
        b"POST /v1/stream/s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 100\r\n\r\nonly part"
    )
    time.sleep(0.5)  # the request is in the app, waiting for the rest of its body
    assert srv.proc is not None
    started = time.monotonic()
    srv.proc.terminate()
    status = srv.proc.wait(timeout=EXIT_WITHIN + 20)
    took = time.monotonic() - started
    print(f"\nexit after SIGTERM, with a request body never finished: {took:.2f} s")
    stalled.close()
    log = srv.log()
    assert took < EXIT_WITHIN, f"exit took {took:.1f} s:\n{log}"
    assert status == 0, log
    assert "resetting 1 connections still busy" in log, log
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert "stopped cleanly" in log, log
    # Nothing of the unfinished append was stored.
    srv2 = server_factory(data_dir=srv.data_dir).start()
    assert httpx.get(f"{srv2.base}s", params={"offset": "-1"}).content == b""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_clean_stop_exits_0(server_factory, sig):
    """A clean stop is a success: a supervisor (systemd, a kubelet, a shell's ``$?``)
    must not see it as a crash. Uvicorn re-raises the signal it handled once it has
    stopped, which made the process die of it (-15) or raise KeyboardInterrupt."""
    srv = server_factory().start()
    assert httpx.put(f"{srv.base}s", headers=TEXT, content=b"hello").status_code == 201
    assert srv.proc is not None
    srv.proc.send_signal(sig)
    status = srv.proc.wait(timeout=EXIT_WITHIN + 20)
    log = srv.log()
    assert status == 0, log
    assert "stopped cleanly" in log and "Traceback" not in log, log


def test_a_stop_with_storage_failed_exits_1(server_factory):
    """A stop that could not close the store cleanly (its storage failed closed: the
    final checkpoint is not taken) still says so to the supervisor."""
    srv = server_factory(env={"DS_FAULT": "eio:fsync:2"}).start()
    assert httpx.put(f"{srv.base}a", headers=TEXT).status_code == 201
    assert httpx.post(f"{srv.base}a", headers=TEXT, content=b"lost").status_code == 503
    assert srv.proc is not None
    srv.proc.terminate()
    status = srv.proc.wait(timeout=EXIT_WITHIN + 20)
    log = srv.log()
    assert status == 1, log
    assert "stopped cleanly" not in log, log
