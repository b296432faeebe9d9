"""Pull-wake against the real server (in-process, on the real engine): wake events on a real
stream, two workers racing. The example worker, as a user runs it, is in
test_programs.py (processes)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.subscriptions._api import (
    Api,
    offset,
    pull,
    receiver_fixture,  # noqa: F401 (the receiver fixture)
    until,
)


@pytest.fixture
def api(app_server):
    srv = app_server()
    a = Api(srv.base, transport=srv.transport)
    yield a
    a.close()


def wake_events(api: Api) -> list[dict]:
    r = api.http.get(f"{api.base}wake/pool", params={"offset": "-1"})
    assert r.status_code == 200, r.text
    return r.json()


def code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


def test_two_workers_race_for_one_lease(api: Api):
    api.stream("wake/pool", b"[]")
    assert api.put("p", pull()).status_code == 201
    api.stream("events/a", b'[{"n":1},{"n":2}]')

    # Both workers tail the wake stream; the event reaches both.
    seen: dict[str, dict] = {}

    def worker(name: str) -> None:
        # The wake is appended once the append is durable, which may be after the
        # append's answer: tail the stream (long-poll) until it arrives.
        with httpx.Client(timeout=30, transport=api.transport) as c:
            params = {"offset": "-1"}
            for _ in range(20):
                r = c.get(f"{api.base}wake/pool", params=params)
                if r.status_code == 200 and r.json():
                    seen[name] = r.json()[-1]
                    return
                params = {"offset": r.headers["stream-next-offset"], "live": "long-poll"}

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["w1"] == seen["w2"]
    event = seen["w1"]
    assert event["type"] == "wake" and event["subscription_id"] == "p"
    assert event["stream"] == "events/a" and event["generation"] == 1

    results = {}
    barrier = threading.Barrier(2)

    def claim(name: str) -> None:
        barrier.wait()
        results[name] = api.post("p", "claim", {"worker": name})

    threads = [threading.Thread(target=claim, args=(n,)) for n in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results.values())
    assert statuses == [200, 409], {n: r.text for n, r in results.items()}
    winner = next(n for n, r in results.items() if r.status_code == 200)
    loser = "w2" if winner == "w1" else "w1"
    busy = results[loser].json()["error"]
    assert busy["code"] == "ALREADY_CLAIMED" and busy["current_holder"] == winner
    assert busy["generation"] == 1
    lease = results[winner].json()
    assert lease["generation"] == 1 and lease["lease_ttl_ms"] == 60_000
    assert lease["streams"] == [
        {
            "path": "events/a",
            "link_type": "glob",
            "acked_offset": offset(0),
            "tail_offset": offset(2),
            "has_pending": True,
        }
    ]
    wake = {"wake_id": lease["wake_id"], "generation": 1}
    tok = lease["token"]

    # Heartbeat with a partial ack; the lease stays with the winner.
    r = api.post("p", "ack", {**wake, "acks": [{"stream": "events/a", "offset": offset(1)}]}, tok)
    assert r.json() == {"ok": True, "next_wake": False}
    assert code(api.post("p", "claim", {"worker": loser})) == "ALREADY_CLAIMED"
    # Done with work still pending past the ack: the answer says a new wake follows.
    r = api.post("p", "ack", {**wake, "done": True}, tok)
    assert r.json() == {"ok": True, "next_wake": True}
    until(lambda: len(wake_events(api)) == 2)
    assert wake_events(api)[1]["generation"] == 2
    # The old token is fenced; the other worker gets the new wake.
    assert code(api.post("p", "ack", {**wake, "done": True}, tok)) == "FENCED"
    second = api.post("p", "claim", {"worker": loser})
    assert second.status_code == 200 and second.json()["generation"] == 2
    s2 = second.json()
    r = api.post(
        "p",
        "ack",
        {
            "wake_id": s2["wake_id"],
            "generation": 2,
            "done": True,
            "acks": [{"stream": "events/a", "offset": offset(2)}],
        },
        s2["token"],
    )
    assert r.json() == {"ok": True, "next_wake": False}
    assert api.acked("p") == {"events/a": offset(2)}
    r = api.post("p", "claim", {"worker": winner})
    assert r.status_code == 409 and code(r) == "NO_PENDING_WORK"


def test_release_and_lease_expiry_offer_the_work_again(api: Api):
    api.stream("wake/pool", b"[]")
    api.put("p", pull(lease=1000))
    api.stream("events/a", b'{"n":1}')
    until(lambda: len(wake_events(api)) == 1)
    c1 = api.post("p", "claim", {"worker": "w1"}).json()
    r = api.post(
        "p", "release", {"wake_id": c1["wake_id"], "generation": c1["generation"]}, c1["token"]
    )
    assert r.status_code == 204
    until(lambda: len(wake_events(api)) == 2)  # still pending: a new wake event
    c2 = api.post("p", "claim", {"worker": "w2"}).json()
    assert c2["generation"] == c1["generation"] + 1
    # w2 never heartbeats: its lease ends after a second and the work is offered again.
    until(lambda: len(wake_events(api)) == 3)
    assert wake_events(api)[2]["generation"] == c2["generation"] + 1
    r = api.post(
        "p",
        "ack",
        {
            "wake_id": c2["wake_id"],
            "generation": c2["generation"],
            "acks": [{"stream": "events/a", "offset": offset(1)}],
        },
        c2["token"],
    )
    assert r.status_code == 409 and code(r) == "FENCED"
    assert api.acked("p") == {"events/a": offset(0)}
    assert api.post("p", "claim", {"worker": "w3"}).status_code == 200


def test_bad_requests_change_nothing(api: Api, receiver):
    api.stream("wake/pool", b"[]")
    api.put("p", pull())
    api.put("h", {"type": "webhook", "pattern": "other/*", "webhook": {"url": receiver.url}})
    for body in [{}, {"worker": ""}, {"worker": 5}, {"worker": "x" * 257}, [1], b"{nope"]:
        r = api.post("p", "claim", body)
        assert r.status_code == 400 and code(r) == "INVALID_REQUEST", (body, r.text)
    assert code(api.post("p", "claim", {"worker": "w"})) == "NO_PENDING_WORK"
    assert code(api.post("h", "claim", {"worker": "w"})) == "INVALID_REQUEST"
    assert code(api.post("nope", "claim", {"worker": "w"})) == "SUBSCRIPTION_NOT_FOUND"
    api.stream("events/a", b'{"n":1}')
    c = api.post("p", "claim", {"worker": "w"}).json()
    wake = {"wake_id": c["wake_id"], "generation": c["generation"]}
    assert code(api.post("p", "ack", {**wake, "done": True})) == "TOKEN_INVALID"
    assert code(api.post("p", "release", wake, "garbage")) == "TOKEN_INVALID"
    assert code(api.post("p", "ack", {**wake, "generation": 0}, c["token"])) == "FENCED"
    before = api.get("p").json()
    assert before["streams"][0]["acked_offset"] == offset(0)
    assert code(api.post("p", "claim", {"worker": "w2"})) == "ALREADY_CLAIMED"
    assert api.get("p").json() == before


def test_wake_events_on_a_text_stream_and_without_a_wake_stream(api: Api):
    # No wake stream yet: a claim still finds the work.
    api.put("p", pull())
    api.stream("events/a", b'{"n":1}')
    c = api.post("p", "claim", {"worker": "w"})
    assert c.status_code == 200, c.text
    # A text wake stream gets one JSON line per event.
    api.stream("wake/text", b"", ct="text/plain")
    api.put("t", {**pull(), "wake_stream": "wake/text"})
    api.append("events/a", b'{"n":2}')
    body = until(lambda: api.http.get(f"{api.base}wake/text", params={"offset": "-1"}).content)
    event = json.loads(body.splitlines()[0])
    assert event["subscription_id"] == "t" and event["stream"] == "events/a"
