"""The fault tools themselves (``testkit.faults``) do what the fault tests rely on: a
proxy that loses an answer after the write happened, cuts that heal, a clock that
really runs slow. Small and quick; the fault tests are ``test_faults_*.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from testkit import needs, wait_for
from testkit.faults.clock import library, measured_rate, slow_clock
from testkit.faults.net import API, Net
from testkit.faults.proxy import ApiProxy

pytestmark = pytest.mark.processes


@pytest.fixture
def upstream() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP server that records every PUT body and answers it 200 (409, unrecorded,
    for a body with ``"stale": true``: a compare-and-swap that lost)."""
    writes: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if json.loads(body).get("stale"):
                self.send_response(409)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                return
            writes.append(body)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", writes
    server.shutdown()


def test_the_proxy_loses_the_answer_of_a_write_that_happened_then_cuts(upstream):
    url, writes = upstream
    with ApiProxy(url) as proxy, httpx.Client(timeout=1) as client:
        assert client.put(f"{proxy.url}/leases/x", json={"n": 1}).status_code == 200
        rule = proxy.lose_answer("PUT", "/leases/", lambda body: body["n"] == 2, then="blackhole")
        with pytest.raises(httpx.RemoteProtocolError):
            client.put(f"{proxy.url}/leases/x", json={"n": 2})
        assert rule.fired.is_set() and json.loads(writes[-1]) == {"n": 2}  # it happened
        with pytest.raises(httpx.ReadTimeout):  # then the API cannot be reached
            client.put(f"{proxy.url}/leases/x", json={"n": 3})
        proxy.cut("refuse")
        with pytest.raises(httpx.RemoteProtocolError):
            client.put(f"{proxy.url}/leases/x", json={"n": 4})
        proxy.heal()
        assert client.put(f"{proxy.url}/leases/x", json={"n": 5}).status_code == 200
        assert [json.loads(w)["n"] for w in writes] == [1, 2, 5]  # 3 and 4 never arrived


def test_a_refused_write_passes_its_answer_on_and_the_rule_waits_for_one_that_lands(upstream):
    """The rule's premise is "the write happened": a 409 (the write lost a compare-and-
    swap) reaches the client, and the retry that lands is the one whose answer is lost
    (a lost-answer fault test once fired on a refused join, whose premise then failed)."""
    url, writes = upstream
    with ApiProxy(url) as proxy, httpx.Client(timeout=1) as client:
        rule = proxy.lose_answer("PUT", "/leases/", lambda body: body["n"] == 1)
        assert client.put(f"{proxy.url}/leases/x", json={"n": 1, "stale": True}).status_code == 409
        assert not rule.fired.is_set()
        with pytest.raises(httpx.RemoteProtocolError):
            client.put(f"{proxy.url}/leases/x", json={"n": 1})
        assert rule.fired.is_set() and [json.loads(w)["n"] for w in writes] == [1]


def test_a_slow_clock_really_runs_slow():
    if library() is None:
        needs.missing("libfaketime is not installed (Debian's faketime: make system-deps)")
    assert 0.4 < measured_rate(slow_clock(0.5)) < 0.6


@needs.commands("ip", "iptables", install="Debian's iproute2 and iptables (make system-deps)")
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_cuts_in_namespaces_drop_what_they_say_and_heal():
    with Net() as net:
        a, b = net.add("a"), net.add("b")
        servers = [
            subprocess.Popen(
                [*net.prefix(n), sys.executable, "-m", "http.server", "-b", ip, "8000"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for n, ip in (("a", a), ("b", b), ("hub", net.addresses[API]))
        ]
        try:

            def reaches(frm: str, ip: str) -> bool:
                code = f"import httpx; httpx.get('http://{ip}:8000/', timeout=0.5)"
                run = [*net.prefix(frm), sys.executable, "-c", code]
                return subprocess.run(run, capture_output=True).returncode == 0

            wait_for(
                lambda: reaches("a", b) and reaches("b", a) and reaches("a", net.addresses[API]),
                timeout=30,
                message="the namespaces' little servers answering",
            )
            net.cut("a", "b")  # two-way; the API stays
            assert (reaches("a", b), reaches("b", a), reaches("a", net.addresses[API])) == (
                False,
                False,
                True,
            )
            net.heal("a")
            net.cut("a", API, one_way=True)
            assert (reaches("a", net.addresses[API]), reaches("a", b)) == (False, True)
            net.heal()
            assert reaches("a", net.addresses[API]) and reaches("b", a)
        finally:
            for s in servers:
                s.kill()
                s.wait()
