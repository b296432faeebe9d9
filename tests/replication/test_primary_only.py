"""Work that writes of its own accord runs on the primary alone: three real servers on
the emulated API server, a real webhook receiver.

Each server signs webhooks with its own key, so the ``kid`` in a delivery's
``Webhook-Signature`` says which server sent it. A standby that delivered
(as every replica did before) would show up as a second kid; a standby that
swept would log refused batches.
"""

from __future__ import annotations

import re

import httpx
import pytest

from testkit.replica_set_processes import FAST, primary_with_standbys, status, until
from tests.subscriptions._api import (
    Api,
    Hook,
    Receiver,
    receiver_fixture,  # noqa: F401 (the receiver fixture)
)

pytestmark = pytest.mark.processes

REFUSED = "write batch failed"  # what a standby logs when it tries to write
TEXT = {"content-type": "text/plain"}


def kid_of(hook: Hook) -> str:
    found = re.search(r"kid=([^,]+)", hook.headers["webhook-signature"])
    assert found is not None, hook.headers
    return found.group(1)


def server_kid(srv) -> str:
    keys = httpx.get(f"{srv.base}__ds/jwks.json", timeout=10).json()["keys"]
    return str(keys[0]["kid"])


def test_webhooks_come_from_the_primary_alone_and_from_the_new_one_after_a_kill(
    start_set, receiver: Receiver
) -> None:
    servers = start_set("hooks", timings=FAST)
    primary = primary_with_standbys(servers, 2)
    kids = {srv.url: server_kid(srv) for srv in servers}  # a standby serves the JWKS too
    assert len(set(kids.values())) == 3
    receiver.answer = lambda hook: (200, {})  # accepted, never done: delivered again
    sub = {
        "type": "webhook",
        "pattern": "events/*",
        "webhook": {"url": receiver.url},
        "lease_ttl_ms": 1000,
    }
    assert Api(primary.base).put("w", sub).status_code == 201
    standby = next(s for s in servers if s is not primary)
    refused = Api(standby.base).put("w", sub)
    assert refused.status_code == 503
    assert refused.headers["stream-primary"] == primary.url
    # Reads on a standby answer from the replicated subscriptions.
    until("the standby reads the subscription", lambda: Api(standby.base).get("w").status_code
          == 200)  # fmt: skip
    Api(primary.base).stream("events/a", b'{"n":1}')
    receiver.wait(1)

    # Every server starts again with the subscription, its wake and pending work
    # in its saved subscriptions: each of them would deliver if each ran the delivery loop.
    for srv in servers:
        srv.stop()
    for srv in servers:
        srv.start()
    primary = primary_with_standbys(servers, 2)
    mark = len(receiver.hooks)
    receiver.wait(mark + 4)  # a lease of 1 s: wake after wake, for some seconds
    after = receiver.hooks[mark:]
    assert {kid_of(h) for h in after} == {kids[primary.url]}
    generations = [h.body["generation"] for h in after]
    assert generations == sorted(set(generations))  # no wake delivered twice

    # kill -9 of the primary: the new one resumes from the replicated subscriptions.
    before = max(h.body["generation"] for h in receiver.hooks)
    mark = len(receiver.hooks)
    primary.kill()
    rest = [s for s in servers if s is not primary]
    new = primary_with_standbys(rest, 1)
    until("the new primary delivers", lambda: any(
        kid_of(h) == kids[new.url] for h in receiver.hooks[mark:]))  # fmt: skip
    since = receiver.hooks[mark:]
    first = next(i for i, h in enumerate(since) if kid_of(h) == kids[new.url])
    assert {kid_of(h) for h in since[:first]} <= {kids[primary.url]}  # in flight at the kill
    assert {kid_of(h) for h in since[first:]} == {kids[new.url]}
    # At least once: the last wake again (its delivery may not have been written
    # before the kill) or a newer one, never an older generation.
    assert since[first].body["generation"] >= before

    # The receiver says done: the cursor moves on the new primary, and the
    # remaining standby reads it from the replicated keyed value.
    receiver.answer = lambda hook: (200, {"done": True})
    tail = Api(new.base).append("events/a", b'{"n":2}')
    until("the cursor reaches the tail", lambda: Api(new.base).acked("w") == {"events/a": tail})
    other = next(s for s in rest if s is not new)
    until("the standby reads the cursor", lambda: Api(other.base).acked("w") == {"events/a": tail})
    assert REFUSED not in other.log_path.read_text()

    # The killed primary comes back as a standby: it loads the same saved subscriptions and
    # still delivers nothing.
    primary.start()
    until("the old primary follows", lambda: status(primary)["primary"] == new.url)
    mark = len(receiver.hooks)
    tail = Api(new.base).append("events/a", b'{"n":3}')
    until("the next wake is acked", lambda: Api(new.base).acked("w") == {"events/a": tail})
    # It may re-copy and restart first (its last frames, written as the kill came,
    # never reached the others): ``until`` waits through it, and through its recovery.
    until("the old primary reads the cursor", lambda: acked_or_none(primary) == {
        "events/a": tail})  # fmt: skip
    assert {kid_of(h) for h in receiver.hooks[mark:]} == {kids[new.url]}
    assert REFUSED not in primary.log_path.read_text().split("took the Lease")[-1]


def acked_or_none(srv) -> dict[str, str] | None:
    """The subscription's cursor on ``srv``; None while it answers otherwise than 200
    (recovering after a restart: 503)."""
    r = Api(srv.base).get("w")
    return {s["path"]: s["acked_offset"] for s in r.json()["streams"]} if r.is_success else None


def streams_held(srv) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("durable_streams_streams "))
    return float(line.split()[1])


def test_a_ttl_stream_expires_on_the_primary_and_the_deletion_reaches_the_standbys(
    start_set,
) -> None:
    servers = start_set("ttl")
    primary = primary_with_standbys(servers, 2)
    standbys = [s for s in servers if s is not primary]
    r = httpx.put(f"{primary.base}short", headers={**TEXT, "stream-ttl": "2"})
    assert r.status_code == 201
    assert httpx.post(f"{primary.base}short", content=b"x;", headers=TEXT).status_code == 204
    for srv in standbys:
        until(f"{srv.url} holds the stream", lambda s=srv: streams_held(s) == 1)
        # A read renews a TTL on the replica that serves it; a standby must not
        # try to write that renewal (or the expiry) itself.
        until(f"{srv.url} serves the stream", lambda s=srv: httpx.get(
            f"{s.base}short?offset=-1", timeout=5).status_code == 200)  # fmt: skip
    until("the primary deleted it", lambda: streams_held(primary) == 0)
    for srv in standbys:
        until(f"the deletion reached {srv.url}", lambda s=srv: streams_held(s) == 0)
        assert httpx.get(f"{srv.base}short?offset=-1", timeout=5).status_code == 404
        assert status(srv)["role"] == "standby"
        assert REFUSED not in srv.log_path.read_text()
