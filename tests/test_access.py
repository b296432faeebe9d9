"""Access control and limits that need a real server process: a token file that stops the
start, TLS, a stalled body's timeout and the header limits on real sockets. Tokens, scopes,
rate limits and stream and reader limits are tested in-process: test_access_rules.py."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys

import httpx
import pytest

from testkit import needs
from testkit.worker_counts import WORKER_COUNTS

pytestmark = pytest.mark.processes

CT = {"Content-Type": "text/plain"}


def test_server_refuses_to_start_with_a_broken_token_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stream_server",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--port",
            "0",
            "--auth-tokens-file",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "token file" in proc.stderr


@needs.commands("openssl", install="Debian's openssl (make system-deps)")
@WORKER_COUNTS
def test_tls(server_factory, tmp_path, workers):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    srv = server_factory("--tls-cert", str(cert), "--tls-key", str(key), "--workers", workers)
    srv.scheme = "https"
    srv.start()
    url = f"https://127.0.0.1:{srv.port}/v1/stream/tls"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert))) as c:
        assert c.put(url, headers=CT, content=b"secret").status_code == 201
        assert c.get(url).content == b"secret"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{srv.port}/v1/stream/tls", timeout=3)


@WORKER_COUNTS
def test_stalled_body_is_cut_off_with_408(server_factory, workers):
    srv = server_factory("--body-timeout", "1", "--workers", workers).start()
    httpx.put(f"{srv.base}slow", headers=CT)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
        sock.sendall(
            b"POST /v1/stream/slow HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 100\r\n\r\nonly ten b"
        )
        reply = sock.recv(4096)
    assert reply.split(b" ", 2)[1] == b"408"
    assert httpx.get(f"{srv.base}slow").content == b""


def test_oversized_or_too_many_headers_are_431(shared_server):
    def status(extra: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", shared_server.port), timeout=10) as s:
            s.sendall(b"GET /v1/stream/h HTTP/1.1\r\nHost: a\r\n" + extra + b"\r\n")
            return s.recv(200).split(b" ", 2)[1]

    assert status(b"X-Big: " + b"a" * 100_000 + b"\r\n") == b"431"
    assert status(b"".join(b"X-H%d: v\r\n" % i for i in range(500))) == b"431"
    assert status(b"X-Fine: v\r\n") == b"404"


@WORKER_COUNTS
@pytest.mark.parametrize(("path", "served"), [(b"/v1/stream/h", b"404"), (b"/healthz", b"200")])
def test_header_limits_are_exact(server_factory, workers, path, served):
    """At the limits a request is served, one byte or one header past them it is 431
    (names and values counted, as --max-header-bytes says). Through a worker too, for
    what it serves and for what it relays to its writer, whose limits leave room for
    what the relay adds to the head."""
    srv = server_factory(
        "--max-header-bytes", "2000", "--max-headers", "10", "--workers", workers
    ).start()

    def status(extra: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: a\r\n" + extra + b"\r\n")
            return s.recv(200).split(b" ", 2)[1]

    # "host" + "a" is 5 bytes, "x-pad" 5 more: the value may take 1,990.
    assert status(b"X-Pad: " + b"p" * 1990 + b"\r\n") == served
    assert status(b"X-Pad: " + b"p" * 1991 + b"\r\n") == b"431"
    assert status(b"".join(b"X-H%d: v\r\n" % i for i in range(9))) == served
    assert status(b"".join(b"X-H%d: v\r\n" % i for i in range(10))) == b"431"
