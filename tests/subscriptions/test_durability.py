"""Subscriptions survive ``kill -9``: configuration, cursors, generations, leases, retries, keys.

Each test kills a real server process with SIGKILL at a point of interest and
starts a new one on the same data directory.
"""

from __future__ import annotations

import threading

import pytest

from tests.subscriptions._api import (
    Api,
    Receiver,
    offset,
    receiver_fixture,  # noqa: F401 (the receiver fixture)
    until,
)

pytestmark = pytest.mark.processes


def restart(srv):
    srv.kill()
    return srv.start()


def test_a_pull_wake_lease_and_its_cursors_survive_a_crash(server_factory):
    srv = server_factory().start()
    api = Api(srv.base)
    kid = api.http.get(api.url("jwks.json")).json()["keys"][0]["kid"]
    api.stream("wake/pool", b"[]")
    assert (
        api.put(
            "p",
            {
                "type": "pull-wake",
                "streams": ["events/a"],
                "pattern": "events/**",
                "wake_stream": "wake/pool",
                "lease_ttl_ms": 600_000,
            },
        ).status_code
        == 201
    )
    api.stream("events/a", b'[{"n":1},{"n":2},{"n":3}]')
    api.stream("events/b/c", b'{"n":1}')
    lease = api.post("p", "claim", {"worker": "w1"}).json()
    wake = {"wake_id": lease["wake_id"], "generation": lease["generation"]}
    r = api.post(
        "p", "ack", {**wake, "acks": [{"stream": "events/a", "offset": offset(2)}]}, lease["token"]
    )
    assert r.status_code == 200
    config = api.get("p").json()

    restart(srv)
    assert api.get("p").json() == config  # configuration, links, cursors, generation
    assert api.http.get(api.url("jwks.json")).json()["keys"][0]["kid"] == kid
    busy = api.post("p", "claim", {"worker": "w2"})
    assert busy.status_code == 409 and busy.json()["error"]["current_holder"] == "w1"
    # The worker's token from before the crash still acks its wake.
    r = api.post(
        "p",
        "ack",
        {**wake, "done": True, "acks": [{"stream": "events/a", "offset": offset(3)}]},
        lease["token"],
    )
    assert r.json() == {"ok": True, "next_wake": True}  # events/b/c is still pending
    assert api.acked("p") == {"events/a": offset(3), "events/b/c": offset(0)}
    until(lambda: len(api.http.get(f"{api.base}wake/pool?offset=-1").json()) == 2)
    api.close()


def test_a_failing_webhook_keeps_its_schedule_and_is_delivered_after_a_crash(
    server_factory, receiver: Receiver
):
    receiver.answer = lambda hook: (500, None)
    srv = server_factory().start()
    api = Api(srv.base)
    api.put("w", {"type": "webhook", "pattern": "events/*", "webhook": {"url": receiver.url}})
    api.stream("events/a", b'{"n":1}')
    first = receiver.wait(1).body
    until(lambda: api.get("w").json()["status"] == "failed")

    restart(srv)
    assert api.get("w").json()["status"] == "failed"  # the retry schedule survived
    receiver.answer = lambda hook: (200, {"done": True})
    n = len(receiver.hooks)
    again = receiver.wait(n + 1).body
    assert (again["wake_id"], again["generation"]) == (first["wake_id"], first["generation"])
    until(lambda: api.acked("w") == {"events/a": offset(1)})
    assert api.get("w").json()["status"] == "active"
    api.close()


def test_a_stream_created_just_before_a_crash_is_still_woken(server_factory, receiver: Receiver):
    receiver.answer = lambda hook: (200, {"done": True})
    srv = server_factory().start()
    api = Api(srv.base)
    api.put("w", {"type": "webhook", "pattern": "events/*", "webhook": {"url": receiver.url}})
    receiver.answer = lambda hook: (500, None)  # nothing is acknowledged before the crash
    api.stream("events/a", b'[{"n":1},{"n":2}]')
    srv.kill()  # whether or not the link was written, the data is pending after the restart
    receiver.answer = lambda hook: (200, {"done": True})
    srv.start()
    until(lambda: api.acked("w") == {"events/a": offset(2)})
    assert any(h.body["streams"][0]["acked_offset"] == offset(0) for h in receiver.hooks)
    api.close()


def test_deletion_survives_a_crash(server_factory, receiver: Receiver):
    srv = server_factory().start()
    api = Api(srv.base)
    api.put(
        "d",
        {
            "type": "webhook",
            "pattern": "events/*",
            "webhook": {"url": receiver.url},
            "lease_ttl_ms": 600_000,
        },
    )
    api.stream("events/a", b'{"n":1}')
    hook = receiver.wait(1).body
    assert api.delete("d").status_code == 204
    restart(srv)
    assert api.get("d").status_code == 404
    r = api.http.post(
        hook["callback_url"],
        json={"wake_id": hook["wake_id"], "generation": hook["generation"], "done": True},
        headers={"authorization": f"Bearer {hook['callback_token']}"},
    )
    assert r.status_code == 409 and r.json()["error"]["code"] == "FENCED"
    api.close()


def test_a_stop_does_not_wait_for_a_receiver_that_hangs(server_factory, receiver: Receiver):
    """SIGTERM with a webhook in flight to a receiver that never answers: the server stops
    cleanly (before the fixture's SIGKILL), and the wake is delivered after a start."""
    hang = threading.Event()
    receiver.answer = lambda hook: (hang.wait(120), (200, {"done": True}))[1]
    srv = server_factory("--webhook-timeout", "600").start()
    api = Api(srv.base)
    api.put("h", {"type": "webhook", "pattern": "events/*", "webhook": {"url": receiver.url}})
    api.stream("events/a", b'{"n":1}')
    receiver.wait(1)
    assert srv.stop() == 0, srv.log()
    assert "stopped cleanly" in srv.log()
    hang.set()
    srv.start()
    receiver.wait(2)
    until(lambda: api.acked("h") == {"events/a": offset(1)})
    api.close()
