"""Access control and resource limits on the real server (in-process, on the real engine):
tokens, scopes and prefixes, the token file's checks, rate limits, and the caps on streams
and live readers. What needs a real process (TLS, sockets, a refused start) is in
test_access.py."""

from __future__ import annotations

import hashlib
import json
import logging
import threading

import httpx
import pytest

from stream_server.auth import AuthConfigError, Denied, TokenAuth
from stream_server.ratelimit import RateLimiter
from testkit import wait_for

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
def secured(app_server, tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(TOKENS))
    return app_server("--auth-tokens-file", str(path))


def test_tokens_scopes_and_prefixes(secured, caplog):
    caplog.set_level(logging.DEBUG)
    base = secured.base
    http = secured.http
    r = http.put(f"{base}orders/a", headers=CT)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert http.put(f"{base}orders/a", headers=CT | bearer("wrong")).status_code == 401
    assert http.put(f"{base}orders/a", headers=CT | bearer("orders-token-456")).status_code == 201
    assert http.put(f"{base}other/a", headers=CT | bearer("orders-token-456")).status_code == 403
    assert (
        http.post(
            f"{base}orders/a", headers=CT | bearer("read-token-123"), content=b"x"
        ).status_code
        == 403
    )
    assert (
        http.post(
            f"{base}orders/a", headers=CT | bearer("orders-token-456"), content=b"x"
        ).status_code
        == 204
    )
    assert http.get(f"{base}orders/a", headers=bearer("read-token-123")).content == b"x"
    assert http.delete(f"{base}orders/a", headers=bearer("orders-token-456")).status_code == 403
    # Forking needs read access to the source too.
    http.put(f"{base}private/src", headers=CT | bearer("admin-token-789"))
    fork = CT | bearer("orders-token-456") | {"Stream-Forked-From": "/v1/stream/private/src"}
    assert http.put(f"{base}orders/fork", headers=fork).status_code == 403
    assert http.delete(f"{base}orders/a", headers=bearer("admin-token-789")).status_code == 204
    # CORS preflight carries no credentials and is answered.
    assert http.options(f"{base}orders/a").status_code == 204
    log = caplog.text
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


def test_rate_limiter_buckets():
    rl = RateLimiter(rate=2, burst=3)
    assert [rl.acquire("a", now=0.0) for _ in range(3)] == [0, 0, 0]
    assert rl.acquire("a", now=0.0) == pytest.approx(0.5)
    assert rl.acquire("b", now=0.0) == 0  # clients are independent
    assert rl.acquire("a", now=1.0) == 0  # refilled


def test_rate_limit_answers_429_with_retry_after(app_server):
    srv = app_server("--rate-limit", "2", "--rate-burst", "3")
    codes = []
    with httpx.Client(transport=srv.transport) as c:
        c.put(f"{srv.base}rl", headers=CT)
        for _ in range(10):
            r = c.head(f"{srv.base}rl")
            codes.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
    assert 429 in codes and codes[0] in (200, 429)


def test_stream_and_live_reader_limits(app_server):
    srv = app_server(
        "--max-streams",
        "2",
        "--max-live-readers",
        "2",
        "--max-live-readers-per-client",
        "5",
        "--long-poll-timeout",
        "5",
    )
    c = srv.http
    assert c.put(f"{srv.base}l1", headers=CT).status_code == 201
    assert c.put(f"{srv.base}l2", headers=CT).status_code == 201
    assert c.put(f"{srv.base}l3", headers=CT).status_code == 503
    live = {"offset": "now", "live": "long-poll"}
    answers: list[int] = []

    def wait_live() -> None:
        with httpx.Client(transport=srv.transport, timeout=20) as own:
            answers.append(own.get(f"{srv.base}l1", params=live).status_code)

    waiting = [threading.Thread(target=wait_live) for _ in range(2)]
    for t in waiting:
        t.start()
    slots = srv.app.streams.live_readers
    wait_for(lambda: slots["long-poll"] == 2, message="both readers hold their slot")
    third = c.get(f"{srv.base}l1", params=live)
    c.post(f"{srv.base}l1", headers=CT, content=b"wake")
    for t in waiting:
        t.join()
    assert [third.status_code, *answers] == [503, 200, 200]
