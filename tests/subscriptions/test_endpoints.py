"""The subscription endpoints over HTTP, against the real server (in-process, on the real
engine: testkit.asgi) and a real receiver.

Every refusal is checked for its status and code, and for leaving the
subscription exactly as it was.
"""

from __future__ import annotations

import base64
import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from testkit.asgi import in_thread
from tests.subscriptions._api import (
    Api,
    Receiver,
    offset,
    receiver_fixture,  # noqa: F401 (the receiver fixture)
    until,
)

JSON = "application/json"


@pytest.fixture
def server(app_server):
    return app_server()


@pytest.fixture
def api(server):
    a = Api(server.base, transport=server.transport)
    yield a
    a.close()


def webhook(url: str, **extra) -> dict:
    return {"type": "webhook", "pattern": "events/*", "webhook": {"url": url}, **extra}


def error(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith(JSON), r.text
    return r.json()["error"]["code"]


def verify(hook, jwks: dict) -> bool:
    """Check a webhook's signature with PyNaCl (the server signs with cryptography)."""
    m = re.fullmatch(
        r"t=(\d+),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)", hook.headers["webhook-signature"]
    )
    assert m, hook.headers["webhook-signature"]
    t, kid, sig = m.groups()
    key = next(k for k in jwks["keys"] if k["kid"] == kid)
    raw_key = base64.urlsafe_b64decode(key["x"] + "=" * (-len(key["x"]) % 4))
    raw_sig = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    try:
        VerifyKey(raw_key).verify(t.encode() + b"." + hook.raw, raw_sig)
    except BadSignatureError:
        return False
    return True


def test_create_reconfirm_conflict_read_and_delete(api: Api, receiver: Receiver):
    body = webhook(receiver.url, description="d", lease_ttl_ms=5000)
    r = api.put("s1", body)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["id"] == created["subscription_id"] == "s1"
    assert created["status"] == "active" and created["lease_ttl_ms"] == 5000
    assert created["webhook"]["signing"]["alg"] == "ed25519"
    assert created["webhook"]["signing"]["jwks_url"] == api.url("jwks.json")
    assert "secret" not in json.dumps(created)

    # The same configuration spelt differently re-confirms it.
    respelt = {**body, "pattern": "/events/*/", "streams": []}
    assert api.put("s1", respelt).status_code == 200
    # A different one is refused, and the subscription is unchanged.
    r = api.put("s1", {**body, "description": "other"})
    assert r.status_code == 409 and error(r) == "SUBSCRIPTION_ALREADY_EXISTS"
    assert api.get("s1").json()["description"] == "d"

    assert api.delete("s1").status_code == 204
    assert api.get("s1").status_code == 404
    assert api.delete("s1").status_code == 204  # deleting a deleted one is idempotent
    r = api.delete("never-existed")
    assert r.status_code == 404 and error(r) == "SUBSCRIPTION_NOT_FOUND"


BAD_BODIES = [
    b"not json",
    b"[1, 2]",
    {"pattern": "events/*", "webhook": {"url": "http://127.0.0.1:9/h"}},  # no type
    {"type": "push", "pattern": "events/*"},
    {"type": "webhook", "webhook": {"url": "http://127.0.0.1:9/h"}},  # no pattern, no streams
    {"type": "webhook", "pattern": "events/*"},  # no webhook.url
    {"type": "webhook", "pattern": "events/*", "webhook": {"url": 5}},
    {"type": "pull-wake", "pattern": "events/*"},  # no wake_stream
    {"type": "pull-wake", "pattern": "events/*", "wake_stream": "__ds/x"},
    {"type": "webhook", "pattern": "ev*nts/*", "webhook": {"url": "http://127.0.0.1:9/h"}},
    {"type": "webhook", "pattern": "a/../b", "webhook": {"url": "http://127.0.0.1:9/h"}},
    {
        "type": "webhook",
        "pattern": "/".join(["*"] * 65),
        "webhook": {"url": "http://127.0.0.1:9/h"},
    },
    {"type": "webhook", "pattern": "x" * 5000, "webhook": {"url": "http://127.0.0.1:9/h"}},
    {"type": "webhook", "pattern": "__ds/**", "webhook": {"url": "http://127.0.0.1:9/h"}},
    {"type": "webhook", "streams": "events/a", "webhook": {"url": "http://127.0.0.1:9/h"}},
    {"type": "webhook", "streams": [""], "webhook": {"url": "http://127.0.0.1:9/h"}},
    {"type": "webhook", "streams": ["a\x01b"], "webhook": {"url": "http://127.0.0.1:9/h"}},
    {"type": "webhook", "streams": ["s"] * 1001, "webhook": {"url": "http://127.0.0.1:9/h"}},
    {
        "type": "webhook",
        "pattern": "e/*",
        "webhook": {"url": "http://127.0.0.1:9/h"},
        "lease_ttl_ms": 999,
    },
    {
        "type": "webhook",
        "pattern": "e/*",
        "webhook": {"url": "http://127.0.0.1:9/h"},
        "lease_ttl_ms": 600_001,
    },
    {
        "type": "webhook",
        "pattern": "e/*",
        "webhook": {"url": "http://127.0.0.1:9/h"},
        "lease_ttl_ms": "5",
    },
    {
        "type": "webhook",
        "pattern": "e/*",
        "webhook": {"url": "http://127.0.0.1:9/h"},
        "lease_ttl_ms": True,
    },
    {
        "type": "webhook",
        "pattern": "e/*",
        "webhook": {"url": "http://127.0.0.1:9/h"},
        "description": 5,
    },
    {
        "type": "webhook",
        "pattern": "e/*",
        "webhook": {"url": "http://127.0.0.1:9/h"},
        "wake_stream": "w",
    },
    {"type": "pull-wake", "streams": ["w"], "wake_stream": "w"},
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_malformed_configurations_are_refused_and_create_nothing(api: Api, body):
    r = api.put("bad", body)
    assert r.status_code == 400, r.text
    assert error(r) == "INVALID_REQUEST" and r.json()["error"]["message"]
    assert api.get("bad").status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "https://10.1.2.3/hook",
        "https://192.168.1.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "http://example.com/hook",  # plain http only for the localhost exception
        "ftp://127.0.0.1/hook",
        "https://[::1]/hook",
        "https://user:pass@example.com/hook",
    ],
)
def test_unsafe_webhook_urls_are_refused(api: Api, url: str):
    r = api.put("unsafe", webhook(url))
    assert r.status_code == 400 and error(r) == "WEBHOOK_URL_REJECTED", r.text
    assert api.get("unsafe").status_code == 404


def test_bad_ids_methods_and_paths(api: Api, receiver: Receiver):
    for bad in ["a" * 129, "a%20b", "%C3%28"]:
        r = api.http.put(api.url(f"subscriptions/{bad}"), json=webhook(receiver.url))
        assert r.status_code == 400 and error(r) == "INVALID_REQUEST", (bad, r.text)
    assert api.put("ok", webhook(receiver.url)).status_code == 201
    r = api.http.post(api.url("subscriptions/ok"), json={})
    assert r.status_code == 405 and error(r) == "METHOD_NOT_ALLOWED"
    assert "PUT" in r.headers["allow"]
    assert api.post("ok", "nonsense", {}).status_code == 404
    assert api.http.get(api.url("elsewhere")).status_code == 404
    r = api.http.put(api.url("subscriptions/big"), content=b" " * (2 * 1024 * 1024))
    assert r.status_code == 413 and error(r) == "PAYLOAD_TOO_LARGE"
    # An encoded spelling of the reserved segment is not a stream either.
    assert api.http.put(f"{api.base}%5F_ds/x", headers={"content-type": JSON}).status_code == 400


def test_jwks(api: Api):
    r = api.http.get(api.url("jwks.json"))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/jwk-set+json")
    assert r.headers["cache-control"] == "public, max-age=300"
    (key,) = r.json()["keys"]
    assert key["kty"] == "OKP" and key["crv"] == "Ed25519" and key["kid"].startswith("ds_")
    assert "d" not in key


def test_membership(api: Api, receiver: Receiver):
    assert (
        api.put(
            "m",
            {
                "type": "webhook",
                "pattern": "events/*",
                "streams": ["manual/a"],
                "webhook": {"url": receiver.url},
            },
        ).status_code
        == 201
    )
    api.stream("events/x")
    assert (
        api.post("m", "streams", {"streams": ["manual/b", "events/x", "manual/b"]}).status_code
        == 204
    )
    assert api.post("m", "streams", {"streams": ["manual/b"]}).status_code == 204  # idempotent
    links = {s["path"]: s["link_type"] for s in api.get("m").json()["streams"]}
    assert links == {"manual/a": "explicit", "manual/b": "explicit", "events/x": "explicit"}

    for path in ["manual%2Fb", "events%2Fx", "not%2Flinked"]:
        r = api.http.delete(api.url(f"subscriptions/m/streams/{path}"))
        assert r.status_code == 204, r.text
    links = {s["path"]: s["link_type"] for s in api.get("m").json()["streams"]}
    # Removing the explicit link leaves the glob link of a stream the pattern matches.
    assert links == {"manual/a": "explicit", "events/x": "glob"}

    before = api.get("m").json()
    for body in [{}, {"streams": "x"}, {"streams": []}, {"streams": ["../x"]}, [1]]:
        r = api.post("m", "streams", body)
        assert r.status_code == 400 and error(r) == "INVALID_REQUEST", (body, r.text)
    assert api.get("m").json() == before
    r = api.post("missing", "streams", {"streams": ["a"]})
    assert r.status_code == 404 and error(r) == "SUBSCRIPTION_NOT_FOUND"


def test_webhook_end_to_end_with_callback_acks_and_fencing(api: Api, receiver: Receiver):
    api.stream("events/old", b'{"n":0}')  # existing: linked at its tail, nothing pending
    created = api.put("w", webhook(receiver.url, lease_ttl_ms=60_000)).json()
    jwks = api.http.get(created["webhook"]["signing"]["jwks_url"]).json()
    assert api.acked("w") == {"events/old": offset(1)}

    api.stream("events/new", b'[{"n":1},{"n":2}]')  # created later, with data: pending
    hook = receiver.wait(1)
    assert verify(hook, jwks)
    # An altered body, or the body under another timestamp, does not verify.
    assert not verify(type(hook)(hook.raw.replace(b'"w"', b'"x"'), hook.body, hook.headers), jwks)
    t = hook.headers["webhook-signature"].split(",")[0]
    later = hook.headers["webhook-signature"].replace(t, f"t={int(t[2:]) + 1}")
    assert not verify(type(hook)(hook.raw, hook.body, {"webhook-signature": later}), jwks)

    b = hook.body
    assert b["subscription_id"] == "w" and b["generation"] == 1
    assert b["callback_url"] == api.url("subscriptions/w/callback")
    (stream,) = b["streams"]
    assert stream == {
        "path": "events/new",
        "link_type": "glob",
        "acked_offset": offset(0),
        "tail_offset": offset(2),
        "has_pending": True,
    }
    token = b["callback_token"]

    def callback(body, tok=token):
        return api.http.post(
            b["callback_url"], json=body, headers={"authorization": f"Bearer {tok}"}
        )

    wake = {"wake_id": b["wake_id"], "generation": 1}
    before = api.acked("w")
    for tok, body, status, code in [
        (None, {**wake}, 401, "TOKEN_INVALID"),
        ("forged." + token.split(".")[1], {**wake}, 401, "TOKEN_INVALID"),
        (token[:-2] + "AA", {**wake}, 401, "TOKEN_INVALID"),
        (
            token[:-5] + ("B" if token[-5] == "A" else "A") + token[-4:],
            {**wake},
            401,
            "TOKEN_INVALID",
        ),
        (token, {"wake_id": "w_other", "generation": 1}, 409, "FENCED"),
        (token, {"wake_id": b["wake_id"], "generation": 2}, 409, "FENCED"),
        (token, {"generation": 1}, 400, "INVALID_REQUEST"),
        (
            token,
            {**wake, "acks": [{"stream": "events/new", "offset": offset(3)}]},
            409,
            "INVALID_OFFSET",
        ),
        (
            token,
            {**wake, "acks": [{"stream": "events/zzz", "offset": offset(1)}]},
            409,
            "INVALID_OFFSET",
        ),
        (
            token,
            {**wake, "acks": [{"stream": "events/new", "offset": "garbage"}]},
            400,
            "INVALID_REQUEST",
        ),
        (
            token,
            {
                **wake,
                "acks": [
                    {"stream": "events/new", "offset": offset(1)},
                    {"stream": "events/new", "offset": offset(9)},
                ],
            },
            409,
            "INVALID_OFFSET",
        ),
        (token, {**wake, "done": "yes"}, 400, "INVALID_REQUEST"),
    ]:
        headers = {"authorization": f"Bearer {tok}"} if tok else {}
        r = api.http.post(b["callback_url"], json=body, headers=headers)
        assert (r.status_code, error(r)) == (status, code), (body, r.text)
    assert api.acked("w") == before  # no refused ack moved a cursor

    # A heartbeat with a partial ack, then an ack that would move backwards (ignored).
    r = callback({**wake, "acks": [{"stream": "events/new", "offset": offset(2)}]})
    assert r.status_code == 200 and r.json() == {"ok": True, "next_wake": False}
    r = callback({**wake, "acks": [{"path": "events/new", "offset": offset(1)}], "done": True})
    assert r.json() == {"ok": True, "next_wake": False}
    assert api.acked("w")["events/new"] == offset(2)
    # The wake is over: its token is stale now.
    r = callback({**wake, "done": True})
    assert r.status_code == 409 and error(r) == "FENCED"

    # New data: a new generation, and a token of the old one does not ack it.
    api.append("events/new", b'{"n":3}')
    hook2 = receiver.wait(2)
    assert hook2.body["generation"] == 2 and hook2.body["wake_id"] != b["wake_id"]
    r = callback({"wake_id": hook2.body["wake_id"], "generation": 2, "done": True})
    assert r.status_code == 409 and error(r) == "FENCED"
    assert verify(hook2, jwks)


def test_done_response_auto_acks_and_new_data_wakes_again(api: Api, receiver: Receiver):
    receiver.answer = lambda hook: (200, {"done": True})
    api.put("d", webhook(receiver.url))
    api.stream("events/a", b'{"n":1}')
    first = receiver.wait(1).body
    until(lambda: api.acked("d")["events/a"] == first["streams"][0]["tail_offset"])
    api.append("events/a", b'{"n":2}')
    second = receiver.wait(2).body
    assert second["generation"] == first["generation"] + 1
    assert second["streams"][0]["acked_offset"] == offset(1)
    until(lambda: api.acked("d")["events/a"] == offset(2))


def test_failed_deliveries_are_retried_with_status_failed(server, api: Api, receiver: Receiver):
    answers = iter([(500, None), (503, None)])
    receiver.answer = lambda hook: next(answers, (200, {"done": True}))
    api.put("r", webhook(receiver.url))
    api.stream("events/a", b'{"n":1}')
    receiver.wait(1)
    until(lambda: api.get("r").json()["status"] == "failed")
    third = receiver.wait(3).body
    assert third["generation"] == 1  # the same wake, retried
    until(lambda: api.get("r").json()["status"] == "active")
    until(lambda: api.acked("r")["events/a"] == offset(1))
    metrics = server.http.get(f"{server.url}/metrics").text
    assert 'durable_streams_subscription_deliveries_total{outcome="http_error"} 2.0' in metrics
    assert "durable_streams_subscription_retries_total 2.0" in metrics
    assert 'durable_streams_subscriptions{type="webhook"} 1.0' in metrics


def test_an_unanswered_wake_is_woken_again_when_its_lease_ends(api: Api, receiver: Receiver):
    api.put("l", webhook(receiver.url, lease_ttl_ms=1000))
    api.stream("events/a", b'{"n":1}')
    first = receiver.wait(1).body
    second = receiver.wait(2).body  # no callback: the lease ran out
    assert second["generation"] == first["generation"] + 1
    r = api.http.post(
        first["callback_url"],
        json={"wake_id": first["wake_id"], "generation": first["generation"], "done": True},
        headers={"authorization": f"Bearer {first['callback_token']}"},
    )
    assert r.status_code == 409 and error(r) == "FENCED"


def test_deletion_fences_callbacks_in_flight(api: Api, receiver: Receiver):
    api.put("x", webhook(receiver.url, lease_ttl_ms=60_000))
    api.stream("events/a", b'{"n":1}')
    b = receiver.wait(1).body
    body = {
        "wake_id": b["wake_id"],
        "generation": b["generation"],
        "done": True,
        "acks": [{"stream": "events/a", "offset": offset(1)}],
    }
    headers = {"authorization": f"Bearer {b['callback_token']}"}
    assert api.delete("x").status_code == 204
    r = api.http.post(b["callback_url"], json=body, headers=headers)
    assert r.status_code == 409 and error(r) == "FENCED"
    # Created again under the same id: a new subscription, which the old token cannot touch.
    assert api.put("x", webhook(receiver.url, lease_ttl_ms=60_000)).status_code == 201
    r = api.http.post(b["callback_url"], json=body, headers=headers)
    assert r.status_code == 401 and error(r) == "TOKEN_INVALID"
    assert api.acked("x") == {"events/a": offset(1)}  # linked at the tail on re-creation
    assert api.get("x").json()["generation"] >= b["generation"]


def test_auth_scopes(app_server, tmp_path, receiver: Receiver):
    tokens = {
        "tokens": [
            {"name": "events-writer", "token": "ew", "scopes": ["write"], "prefixes": ["events/"]},
            {"name": "events-reader", "token": "er", "scopes": ["read"], "prefixes": ["events/"]},
            {"name": "other-writer", "token": "ow", "scopes": ["write"], "prefixes": ["other/"]},
            {"name": "admin", "token": "ad", "scopes": ["admin"]},
        ]
    }
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(tokens))
    srv = app_server("--auth-tokens-file", str(path))
    anon, writer, reader, other, admin = (
        Api(srv.base, t, srv.transport) for t in (None, "ew", "er", "ow", "ad")
    )
    body = webhook(receiver.url)
    r = anon.put("a", body)
    assert r.status_code == 401 and error(r) == "UNAUTHORIZED"
    for api in (reader, other):
        r = api.put("a", body)
        assert r.status_code == 403 and error(r) == "FORBIDDEN"
    r = writer.put("a", {**body, "pattern": "**"})  # covers more than events/
    assert r.status_code == 403
    assert admin.get("a").status_code == 404  # nothing was created
    assert writer.put("a", body).status_code == 201
    assert reader.get("a").status_code == 200
    assert other.get("a").status_code == 403
    assert other.delete("a").status_code == 403
    assert anon.http.get(anon.url("jwks.json")).status_code == 200  # public keys are public

    writer.stream("events/x", b'{"n":1}')
    hook = receiver.wait(1).body
    # A service token is not a callback token.
    r = writer.http.post(hook["callback_url"], json={"wake_id": hook["wake_id"], "generation": 1})
    assert r.status_code == 401 and error(r) == "TOKEN_INVALID"
    r = anon.http.post(
        hook["callback_url"],
        json={"wake_id": hook["wake_id"], "generation": 1, "done": True},
        headers={"authorization": f"Bearer {hook['callback_token']}"},
    )
    assert r.status_code == 200, r.text
    assert writer.delete("a").status_code == 204
    # The wake stream is covered too; claiming a lease takes read on every covered path.
    pull = {"type": "pull-wake", "pattern": "events/*", "wake_stream": "wake/w"}
    assert writer.put("p", pull).status_code == 403  # no write on wake/w
    assert writer.put("p", {**pull, "wake_stream": "events/wake"}).status_code == 201
    r = other.post("p", "claim", {"worker": "w"})
    assert r.status_code == 403 and error(r) == "FORBIDDEN"
    r = reader.post("p", "claim", {"worker": "w"})
    assert r.status_code == 409 and error(r) == "NO_PENDING_WORK"
    for api in (anon, writer, reader, other, admin):
        api.close()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = [
    "type",
    "pattern",
    "streams",
    "webhook",
    "wake_stream",
    "lease_ttl_ms",
    "acks",
    "done",
    "wake_id",
    "generation",
    "worker",
    "stream",
    "offset",
    "url",
]
BODIES = st.one_of(
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(KEYS), JSON_VALUES, max_size=6).map(
        lambda v: json.dumps(v).encode()
    ),
    st.binary(max_size=40),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    action=st.sampled_from(
        [
            "",
            "/streams",
            "/claim",
            "/ack",
            "/release",
            "/callback",
            "/streams/a%2Fb",
            "/streams/%FF",
        ]
    ),
    method=st.sampled_from(["PUT", "POST", "DELETE", "GET"]),
    body=BODIES,
    token=st.sampled_from([None, "x", "a.b", "eyJzIjoiZiJ9.AAAA"]),
)
def test_hostile_requests_never_fail_the_server_nor_change_a_subscription(
    shared_subscription, action, method, body, token
):
    api, state = shared_subscription
    whole = not action and method in ("PUT", "DELETE")
    sub_id = "fuzzed" if whole else "fixed"
    headers = {"authorization": f"Bearer {token}"} if token else {}
    url = api.url(f"subscriptions/{sub_id}{action}")
    r = api.http.request(method, url, content=body, headers=headers)
    assert r.status_code < 500, (method, action, body, r.status_code, r.text)
    after = api.get("fixed").json()
    if r.status_code >= 400:
        assert r.json()["error"]["code"], r.text
        assert after == state["fixed"], (method, action, body, r.text)  # a refusal changes nothing
    state["fixed"] = after


@pytest.fixture(scope="module")
def shared_subscription(tmp_path_factory):
    with in_thread(tmp_path_factory.mktemp("fuzz") / "data") as srv:
        api = Api(srv.base, transport=srv.transport)
        api.stream("wake/pool", b"[]")
        api.stream("a/b", b'{"n":1}')
        assert (
            api.put(
                "fixed",
                {
                    "type": "pull-wake",
                    "pattern": "events/*",
                    "streams": ["a/b"],
                    "wake_stream": "wake/pool",
                },
            ).status_code
            == 201
        )
        yield api, {"fixed": api.get("fixed").json()}
        api.close()
