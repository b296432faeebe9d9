"""The replica set's peer token (``--replication-token-file``): stream, snapshot and
switchover need it as a bearer token, followers send it, ``GET /replication`` stays
open. Real server processes on the emulated Lease API (the conftest's sets)."""

from __future__ import annotations

import io
import secrets
import tarfile
from pathlib import Path

import httpx
import pytest

from stream_server.config import Settings
from testkit.replica_set_processes import FAST, primary_with_standbys, status, until
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.processes


def token_file(path: Path) -> Path:
    path.write_text(secrets.token_urlsafe(32) + "\n")
    return path


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def peer_requests(primary: ServerProcess, standby: str) -> dict[str, httpx.Request]:
    """One request to each guarded endpoint; each changes nothing unless it is let in."""
    st = status(primary)
    pos = st["followers"][standby]  # the standby's own position
    return {
        # A term past the primary's: let in, it is refused (409) and opens no stream.
        "stream": httpx.Request(
            "GET",
            f"{primary.url}/replication/stream",
            params={
                "name": standby,
                "term": st["term"] + 1,
                "after_term": pos["term"],
                "after_lsn": pos["lsn"],
                "committed": 0,
            },
            headers={"Connection": "upgrade", "Upgrade": "pyds-replication/2"},
        ),
        "snapshot": httpx.Request("GET", f"{primary.url}/replication/snapshot"),
        "switchover": httpx.Request(
            "POST", f"{primary.url}/replication/switchover", json={"to": "nobody"}
        ),
    }


def create_and_append(url: str) -> None:
    """A write acknowledged by the primary: it needed a standby in sync."""
    text = {"Content-Type": "text/plain"}
    assert httpx.put(url, headers=text, timeout=30).status_code == 201
    assert httpx.post(url, content=b"x", headers=text, timeout=30).status_code == 204


def send(request: httpx.Request, headers: dict[str, str]) -> httpx.Response:
    request.headers.update(headers)
    with httpx.Client(timeout=10) as client:
        return client.send(request)


def test_peer_endpoints_need_the_token_and_followers_send_it(start_set, tmp_path):
    secret_file = token_file(tmp_path / "token")
    servers = start_set("peer-auth", "--replication-token-file", str(secret_file))
    # In sync at all means the standbys' streams carried the token.
    primary = primary_with_standbys(servers, 2)
    standby = status(primary)["in_sync"][0]
    secret = secret_file.read_text().strip()
    assert httpx.get(f"{primary.url}/replication", timeout=5).status_code == 200  # open
    before = status(primary)
    refused = peer_requests(primary, standby)
    for what, request in refused.items():
        for headers in ({}, bearer("wrong"), bearer(secret + "x"), {"Authorization": secret}):
            r = send(request, headers)
            assert r.status_code == 401, (what, headers, r.status_code, r.text)
            assert r.json()["error"]["code"] == "UNAUTHORIZED"
    after = status(primary)
    assert (after["role"], after["term"], after["in_sync"]) == (
        before["role"],
        before["term"],
        before["in_sync"],
    )
    let_in = {
        what: send(req, bearer(secret)) for what, req in peer_requests(primary, standby).items()
    }
    assert let_in["stream"].status_code == 409, let_in["stream"].text
    assert let_in["stream"].json()["error"] == "wrong term"
    assert let_in["snapshot"].status_code == 200, let_in["snapshot"].text
    with tarfile.open(fileobj=io.BytesIO(let_in["snapshot"].content)) as tar:
        assert "meta" in tar.getnames()
    assert let_in["switchover"].status_code == 409  # let in; "nobody" is no standby
    assert let_in["switchover"].json()["error"]["code"] == "NOT_IN_SYNC"

    # A new secret in the file (a rotated Secret) is read again: the old one is refused,
    # and the standbys, which read the same file, stay in sync with it.
    new_secret = secrets.token_urlsafe(32)
    secret_file.write_text(new_secret + "\n")
    switch = f"{primary.url}/replication/switchover"
    until(
        "the new token in use",
        lambda: (
            httpx.post(switch, json={"to": "nobody"}, headers=bearer(secret)).status_code == 401
        ),
        timeout=30,
    )
    r = httpx.post(switch, json={"to": "nobody"}, headers=bearer(new_secret), timeout=10)
    assert r.status_code == 409, r.text
    url = f"{primary.base}peer-auth"
    create_and_append(url)
    assert len(status(primary)["in_sync"]) == 2


def test_a_standby_with_the_wrong_token_gets_no_frames(start_set, server_factory, api, tmp_path):
    good = token_file(tmp_path / "good")
    servers = start_set("peer-wrong", "--replication-token-file", str(good), count=2, set_size=3)
    primary = primary_with_standbys(servers, 1)
    stranger = server_factory()
    stranger.args += [
        "--replication-lease", "default/peer-wrong",
        "--replica-name", "r2",
        "--replica-url", stranger.url,
        "--kube-api", api.url,
        "--replication-set-size", "3",
        "--replication-token-file", str(token_file(tmp_path / "bad")),
        *FAST,
    ]  # fmt: skip
    stranger.start()
    until(
        "the stranger refused",
        lambda: "401" in str(status(stranger).get("problem")),
        timeout=30,
    )
    url = f"{primary.base}wrong-token"
    create_and_append(url)
    assert "r2" not in status(primary)["in_sync"]
    assert status(stranger)["durable"]["lsn"] == 0
    # Never current (no primary answered it): it refuses reads rather than say "no such
    # stream" from its empty store.
    r = httpx.get(f"{stranger.base}wrong-token", timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "STALE_REPLICA"
    assert status(stranger)["fresh_for"] == 0


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_missing_or_empty_token_file_is_refused_at_start(tmp_path, content):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match="replication-token-file"):
        Settings(replication_token_file=str(path))
