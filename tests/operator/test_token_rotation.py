"""Issue 42: the peer token rotates (token_rotation.py), and no two neighbouring
versions of the Secret refuse each other: the server (peer_token.PeerToken, reading the
real file) accepts every line and sends the first; the real kopf operator starts a
rotation when the DurableStream's annotation asks for one."""

from __future__ import annotations

import base64
import datetime
import itertools
from pathlib import Path

import pytest

from stream_operator import KIND
from stream_operator.controllers import token_rotation as rot
from stream_server.replication.peers.peer_token import PeerToken
from testkit import wait_for
from testkit.cluster import cluster
from testkit.kube import durable_stream
from testkit.operator import running_operator
from testkit.operator_rbac import assert_role_grants_what_the_operator_did

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
PERIOD = 30 * DAY


def server(tmp_path: Path, tokens: list[str]) -> PeerToken:
    path = tmp_path / "token"
    path.write_text("\n".join(tokens) + "\n")
    return PeerToken(str(path))


def test_a_full_rotation_never_refuses_a_neighbouring_version(tmp_path: Path) -> None:
    versions = [["old"]]
    notes: dict[str, str] = {}
    first = rot.step(["old"], notes, None, NOW, PERIOD, "new")
    assert first is not None and first.tokens == ["old"]  # its age starts now
    notes = first.annotations
    assert rot.step(["old"], notes, None, NOW + 29 * DAY, PERIOD, "new") is None
    at = NOW + PERIOD
    adding = rot.step(["old"], notes, None, at, PERIOD, "new")
    assert adding is not None and adding.tokens == ["old", "new"]
    versions.append(adding.tokens)
    assert rot.step(adding.tokens, adding.annotations, None, at, PERIOD, "x") is None
    at += rot.PROPAGATION
    sending = rot.step(adding.tokens, adding.annotations, None, at, PERIOD, "x")
    assert sending is not None and sending.tokens == ["new", "old"]
    versions.append(sending.tokens)
    at += rot.PROPAGATION
    done = rot.step(sending.tokens, sending.annotations, None, at, PERIOD, "x")
    assert done is not None and done.tokens == ["new"]
    versions.append(done.tokens)
    assert rot.step(done.tokens, done.annotations, None, at + DAY, PERIOD, "x") is None
    for older, newer in itertools.pairwise(versions):
        a, b = server(tmp_path / "a", older), server(tmp_path / "b", newer)
        assert b.allows(a.headers()["Authorization"]), (older, newer)
        assert a.allows(b.headers()["Authorization"]), (older, newer)
    assert not server(tmp_path / "c", ["new"]).allows("Bearer old")


def test_an_annotation_rotates_once_per_value() -> None:
    settled = {rot.SINCE: NOW.isoformat()}
    asked = rot.step(["old"], settled, "1", NOW + DAY, PERIOD, "new")
    assert asked is not None and asked.tokens == ["old", "new"]
    assert asked.annotations[rot.HANDLED] == "1"
    done = {rot.SINCE: NOW.isoformat(), rot.HANDLED: "1"}
    assert rot.step(["new"], done, "1", NOW + DAY, PERIOD, "x") is None
    assert rot.step(["new"], done, "2", NOW + DAY, PERIOD, "x") is not None


def test_the_server_sends_the_first_token_and_rereads_the_file(tmp_path: Path) -> None:
    token = server(tmp_path / "a", ["one", "two"])
    assert token.headers() == {"Authorization": "Bearer one"}
    assert token.allows("Bearer two") and token.allows("Bearer one")
    (tmp_path / "a" / "token").write_text("two\n")
    wait_for(lambda: token.headers() == {"Authorization": "Bearer two"}, message="re-read")
    assert not token.allows("Bearer one")
    assert rot.sent_token("a\nb\n") == "a"


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path) -> None:
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir(exist_ok=True)


@pytest.mark.slow
def test_the_operator_starts_a_rotation_when_asked() -> None:
    def tokens(c: object) -> list[str]:
        secret = c.get("Secret", "default", "events-replication") or {}  # type: ignore[attr-defined]
        raw = (secret.get("data") or {}).get("token", "")
        return base64.b64decode(raw).decode().split()

    with cluster() as c, running_operator(c):
        c.create(durable_stream("events", {"replicas": 3})).raise_for_status()
        wait_for(lambda: len(tokens(c)) == 1, message="the peer token")
        (first,) = tokens(c)
        ask = {"metadata": {"annotations": {rot.REQUEST: "now"}}}
        c.patch(KIND, "default", "events", ask).raise_for_status()
        wait_for(lambda: tokens(c) != [first], message="a rotation started")
        assert tokens(c)[0] == first and len(tokens(c)) == 2  # accepted before it is sent
        assert_role_grants_what_the_operator_did(c)
