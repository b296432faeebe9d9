"""Hostile requests the server bounds, against the real server (in-process, on the real
engine): keys longer than LMDB allows, caching with auth, the base path spelt literally,
producer state and fork depth, failed authentication against the rate, and token
prefixes (issue 11's findings 6, 8, 9 and 10). The ones that need real sockets and a
process's memory are in test_hostile_requests.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import httpx
import pytest

from testkit.asgi import RAW_TARGET, in_thread

TEXT = {"Content-Type": "text/plain"}
BIN = {"Content-Type": "application/octet-stream"}


# ----------------------------------------------- 6. keys longer than LMDB allows


def test_long_keys_get_400_and_never_fail_other_clients_appends(app_server):
    srv = app_server()
    good = f"{srv.base}good"
    assert srv.http.put(good, headers=BIN).status_code == 201
    statuses: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        with httpx.Client(timeout=30, transport=srv.transport) as c:
            while not stop.is_set():
                statuses.append(c.post(good, headers=BIN, content=b"ok").status_code)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    hostile: list[int] = []
    try:
        with httpx.Client(timeout=30, transport=srv.transport) as c:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                hostile.append(c.put(f"{srv.base}{'p' * 600}", headers=BIN).status_code)
                hostile.append(
                    c.post(
                        good,
                        headers=BIN
                        | {"Producer-Id": "q" * 600, "Producer-Epoch": "0", "Producer-Seq": "0"},
                        content=b"no",
                    ).status_code
                )
                # A path that fits the raw limit but not the key, once decoded.
                hostile.append(c.put(f"{srv.base}{'%C3%A9' * 300}", headers=BIN).status_code)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert set(hostile) == {400}
    assert statuses and set(statuses) == {204}, set(statuses)
    body = srv.http.get(good, params={"offset": "-1"}).content
    assert body == b"ok" * len(statuses)


# ---------------------------------------------------------- 8. caching with auth


def test_reads_with_auth_are_private_and_vary_on_authorization(app_server, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"name": "ops", "token": "t", "scopes": ["admin"]}]}))
    srv = app_server("--auth-tokens-file", str(tokens))
    auth = {"Authorization": "Bearer t"}
    assert srv.http.put(f"{srv.base}c", headers=TEXT | auth, content=b"secret").status_code == 201
    r = srv.http.get(f"{srv.base}c", params={"offset": "-1"}, headers=auth)
    assert r.status_code == 200
    assert r.headers["cache-control"].startswith("private")
    assert "public" not in r.headers["cache-control"]
    assert "authorization" in r.headers["vary"].lower()


def test_reads_without_auth_stay_publicly_cacheable(app_server):
    srv = app_server()
    url = f"{srv.base}cache/{uuid.uuid4().hex}"
    assert srv.http.put(url, headers=TEXT, content=b"open").status_code == 201
    r = srv.http.get(url, params={"offset": "-1"})
    assert r.headers["cache-control"].startswith("public")


# ------------------------------------------------ 9. the base path, spelt literally


@pytest.mark.parametrize("raw", ["/v1/stre%61m/b/x", "/v1/stream%2Fq/zz", "/v1%2Fstream/m/y"])
def test_an_encoded_base_path_is_refused(app_server, raw):
    srv = app_server()
    # The target as sent: a client would normalise it.
    r = srv.http.put(f"{srv.url}/", headers=TEXT, extensions={RAW_TARGET: raw.encode()})
    assert r.status_code in (400, 404)
    for name in ("m/b/x", "b/x", "2Fq/zz", "q/zz", "m/y"):
        assert srv.http.head(f"{srv.base}{name}").status_code == 404


# ------------------------------------------------------------------ 10. smaller ones


def producer(pid: str, seq: int) -> dict[str, str]:
    return BIN | {"Producer-Id": pid, "Producer-Epoch": "0", "Producer-Seq": str(seq)}


def test_producer_state_per_stream_is_bounded(tmp_path):
    data = tmp_path / "pdata"
    with in_thread(data, "--max-producers-per-stream", "5") as srv:
        c = srv.http
        url = f"{srv.base}prod"
        assert c.put(url, headers=BIN).status_code == 201
        for i in range(10):
            assert c.post(url, headers=producer(f"p{i}", 0), content=b"x").status_code == 200
        # p9 was active last: remembered. p0 was the least recently active: forgotten,
        # so its next sequence number is a gap (409), never a duplicate.
        assert c.post(url, headers=producer("p9", 1), content=b"y").status_code == 200
        assert c.post(url, headers=producer("p9", 1), content=b"y").status_code == 204
        r = c.post(url, headers=producer("p0", 1), content=b"y")
        assert r.status_code == 409 and r.headers["producer-expected-seq"] == "0"
    with in_thread(data, "--max-producers-per-stream", "5") as srv:  # a second start
        c = srv.http
        # Forgetting is durable, and so is what was remembered.
        assert c.post(url, headers=producer("p1", 1), content=b"z").status_code == 409
        assert c.post(url, headers=producer("p9", 1), content=b"y").status_code == 204


def test_fork_depth_is_capped(app_server):
    srv = app_server("--max-fork-depth", "3")
    http = srv.http
    assert http.put(f"{srv.base}f0", headers=TEXT, content=b"root").status_code == 201
    for depth in range(1, 4):
        r = http.put(f"{srv.base}f{depth}", headers=TEXT | {"Stream-Forked-From": f"f{depth - 1}"})
        assert r.status_code == 201, (depth, r.text)
    r = http.put(f"{srv.base}f4", headers=TEXT | {"Stream-Forked-From": "f3"})
    assert r.status_code == 400 and "deep" in r.text
    assert http.head(f"{srv.base}f4").status_code == 404
    assert http.get(f"{srv.base}f3", params={"offset": "-1"}).content == b"root"


def test_failed_authentication_counts_against_the_rate(app_server, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"name": "ops", "token": "t", "scopes": ["admin"]}]}))
    srv = app_server("--auth-tokens-file", str(tokens), "--rate-limit", "0.5", "--rate-burst", "3")
    with httpx.Client(timeout=10, transport=srv.transport) as c:
        codes = [
            c.get(f"{srv.base}x", headers={"Authorization": f"Bearer guess-{i}"}).status_code
            for i in range(6)
        ]
    assert codes[:3] == [401, 401, 401]
    assert set(codes[3:]) == {429}


def test_token_prefixes_match_whole_segments(app_server, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "t1", "token": "t1", "scopes": ["write"], "prefixes": ["team1"]},
                    {"name": "t2", "token": "t2", "scopes": ["write"], "prefixes": ["team2/"]},
                ]
            }
        )
    )
    srv = app_server("--auth-tokens-file", str(tokens))

    def put(token: str, path: str) -> int:
        return srv.http.put(
            f"{srv.base}{path}", headers=TEXT | {"Authorization": f"Bearer {token}"}
        ).status_code

    assert put("t1", "team1/a") == 201
    assert put("t1", "team10/a") == 403
    assert put("t1", "team1x") == 403
    assert put("t2", "team2/b") == 201
    assert put("t2", "team20/b") == 403
