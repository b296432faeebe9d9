"""Access control, TLS, rate limits and resource limits on real server processes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import ssl
import subprocess
import sys

import httpx
import pytest

from stream_server.auth import AuthConfigError, Denied, TokenAuth
from stream_server.ratelimit import RateLimiter
from testkit import needs

pytestmark = pytest.mark.processes

CT = {"Content-Type": "text/plain"}
TOKENS = {
    "tokens": [
        {"name": "reader", "token": "read-token-123", "scopes": ["read"]},
        {
            "name": "orders-writer",
            "sha256": hashlib.sha256(b"orders-token-456").hexdigest(),
            "scopes": ["read", "write"],
            "prefixes": ["orders/"],
        },
        {"name": "ops", "token": "admin-token-789", "scopes": ["admin"]},
    ]
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def secured(server_factory, tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(TOKENS))
    return server_factory("--auth-tokens-file", str(path)).start()


def test_tokens_scopes_and_prefixes(secured):
    base = secured.base
    r = httpx.put(f"{base}orders/a", headers=CT)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert httpx.put(f"{base}orders/a", headers=CT | bearer("wrong")).status_code == 401
    assert httpx.put(f"{base}orders/a", headers=CT | bearer("orders-token-456")).status_code == 201
    assert httpx.put(f"{base}other/a", headers=CT | bearer("orders-token-456")).status_code == 403
    assert (
        httpx.post(
            f"{base}orders/a", headers=CT | bearer("read-token-123"), content=b"x"
        ).status_code
        == 403
    )
    assert (
        httpx.post(
            f"{base}orders/a", headers=CT | bearer("orders-token-456"), content=b"x"
        ).status_code
        == 204
    )
    assert httpx.get(f"{base}orders/a", headers=bearer("read-token-123")).content == b"x"
    assert httpx.delete(f"{base}orders/a", headers=bearer("orders-token-456")).status_code == 403
    # Forking needs read access to the source too.
    httpx.put(f"{base}private/src", headers=CT | bearer("admin-token-789"))
    fork = CT | bearer("orders-token-456") | {"Stream-Forked-From": "/v1/stream/private/src"}
    assert httpx.put(f"{base}orders/fork", headers=fork).status_code == 403
    assert httpx.delete(f"{base}orders/a", headers=bearer("admin-token-789")).status_code == 204
    # CORS preflight carries no credentials and is answered.
    assert httpx.options(f"{base}orders/a").status_code == 204
    log = secured.log()
    for secret in ("read-token-123", "orders-token-456", "admin-token-789"):
        assert secret not in log


def test_token_file_validation(tmp_path):
    bad = tmp_path / "bad.json"
    for content in [
        "not json",
        '{"tokens": []}',
        '{"tokens": [{"name": "x"}]}',
        '{"tokens": [{"token": "t", "scopes": ["root"]}]}',
        '{"tokens": [{"sha256": "abc"}]}',
    ]:
        bad.write_text(content)
        with pytest.raises(AuthConfigError):
            TokenAuth.from_file(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(TOKENS))
    auth = TokenAuth.from_file(good)
    assert auth.check("Bearer admin-token-789", "DELETE", "x", None).name == "ops"
    with pytest.raises(Denied) as denied:
        auth.check("Basic abc", "GET", "x", None)
    assert denied.value.status == 401


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


def test_rate_limiter_buckets():
    rl = RateLimiter(rate=2, burst=3)
    assert [rl.acquire("a", now=0.0) for _ in range(3)] == [0, 0, 0]
    assert rl.acquire("a", now=0.0) == pytest.approx(0.5)
    assert rl.acquire("b", now=0.0) == 0  # clients are independent
    assert rl.acquire("a", now=1.0) == 0  # refilled


def test_rate_limit_answers_429_with_retry_after(server_factory):
    srv = server_factory("--rate-limit", "2", "--rate-burst", "3").start()
    codes = []
    with httpx.Client() as c:
        c.put(f"{srv.base}rl", headers=CT)
        for _ in range(10):
            r = c.head(f"{srv.base}rl")
            codes.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
    assert 429 in codes and codes[0] in (200, 429)


@needs.commands("openssl", install="Debian's openssl (make system-deps)")
def test_tls(server_factory, tmp_path):
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
    srv = server_factory("--tls-cert", str(cert), "--tls-key", str(key))
    srv.scheme = "https"
    srv.start()
    url = f"https://127.0.0.1:{srv.port}/v1/stream/tls"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert))) as c:
        assert c.put(url, headers=CT, content=b"secret").status_code == 201
        assert c.get(url).content == b"secret"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{srv.port}/v1/stream/tls", timeout=3)


def test_stalled_body_is_cut_off_with_408(server_factory):
    srv = server_factory("--body-timeout", "1").start()
    httpx.put(f"{srv.base}slow", headers=CT)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
        sock.sendall(
            b"POST /v1/stream/slow HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 100\r\n\r\nonly ten b"
        )
        reply = sock.recv(4096)
    assert reply.split(b" ", 2)[1] == b"408"
    assert httpx.get(f"{srv.base}slow").content == b""


def test_stream_and_live_reader_limits(server_factory):
    srv = server_factory(
        "--max-streams",
        "2",
        "--max-live-readers",
        "2",
        "--max-live-readers-per-client",
        "5",
        "--long-poll-timeout",
        "5",
    ).start()
    assert httpx.put(f"{srv.base}l1", headers=CT).status_code == 201
    assert httpx.put(f"{srv.base}l2", headers=CT).status_code == 201
    assert httpx.put(f"{srv.base}l3", headers=CT).status_code == 503

    async def live() -> list[int]:
        async with httpx.AsyncClient(timeout=20) as c:
            waiting = [
                asyncio.create_task(
                    c.get(f"{srv.base}l1", params={"offset": "now", "live": "long-poll"})
                )
                for _ in range(2)
            ]
            await asyncio.sleep(0.5)
            third = await c.get(f"{srv.base}l1", params={"offset": "now", "live": "long-poll"})
            await c.post(f"{srv.base}l1", headers=CT, content=b"wake")
            done = await asyncio.gather(*waiting)
            return [third.status_code, *(r.status_code for r in done)]

    assert asyncio.run(live()) == [503, 200, 200]


def test_oversized_or_too_many_headers_are_431(shared_server):
    def status(extra: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", shared_server.port), timeout=10) as s:
            s.sendall(b"GET /v1/stream/h HTTP/1.1\r\nHost: a\r\n" + extra + b"\r\n")
            return s.recv(200).split(b" ", 2)[1]

    assert status(b"X-Big: " + b"a" * 100_000 + b"\r\n") == b"431"
    assert status(b"".join(b"X-H%d: v\r\n" % i for i in range(500))) == b"431"
    assert status(b"X-Fine: v\r\n") == b"404"


def test_header_limits_are_exact(server_factory):
    """At the limits a request is served, one byte or one header past them it is 431
    (names and values counted, as --max-header-bytes says)."""
    srv = server_factory("--max-header-bytes", "2000", "--max-headers", "10").start()

    def status(extra: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /v1/stream/h HTTP/1.1\r\nHost: a\r\n" + extra + b"\r\n")
            return s.recv(200).split(b" ", 2)[1]

    # "host" + "a" is 5 bytes, "x-pad" 5 more: the value may take 1,990.
    assert status(b"X-Pad: " + b"p" * 1990 + b"\r\n") == b"404"
    assert status(b"X-Pad: " + b"p" * 1991 + b"\r\n") == b"431"
    assert status(b"".join(b"X-H%d: v\r\n" % i for i in range(9))) == b"404"
    assert status(b"".join(b"X-H%d: v\r\n" % i for i in range(10))) == b"431"
