"""The subscription model and manager in process, over a real store in a temporary directory."""

from __future__ import annotations

import base64
import string

import pytest

from stream_server.streams.store import AppendRequest, CreateRequest, StreamStore
from stream_server.subscriptions import tokens
from stream_server.subscriptions.glob import Pattern, PatternError
from stream_server.subscriptions.manager import Ack, SubscriptionManager
from stream_server.subscriptions.state import Subscription, Tombstone, from_value
from stream_server.subscriptions.subscription_errors import SubscriptionError

JSON = "application/json"


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("events/*", "events/a", True),
        ("events/*", "events/a/b", False),
        ("events/*", "events", False),
        ("events/**", "events", True),
        ("events/**", "events/a/b/c", True),
        ("**/x", "x", True),
        ("**/x", "a/b/x", True),
        ("**/x", "a/b/y", False),
        ("a/**/b/*", "a/b/c", True),
        ("a/**/b/*", "a/q/r/b/c", True),
        ("a/**/b/*", "a/q/r/b", False),
        ("*", "a", True),
        ("**", "a/b", True),
    ],
)
def test_glob(pattern: str, path: str, matches: bool):
    assert Pattern.parse(pattern, max_bytes=1024).matches(path) is matches


def test_a_hostile_pattern_is_refused_or_cheap():
    with pytest.raises(PatternError):
        Pattern.parse("a*", max_bytes=1024)
    with pytest.raises(PatternError):
        Pattern.parse("/".join(["**", "a"] * 40), max_bytes=1024)
    # Many ** alternating with literals that almost match: naive backtracking is
    # exponential here, the table is not (this returns at once).
    p = Pattern.parse("/".join(["**", "a"] * 30), max_bytes=1024)
    assert not p.matches("/".join(["a"] * 29 + ["b"]))
    assert Pattern.parse("**/**/x", max_bytes=1024).text == "**/x"
    assert Pattern.parse("a/b/*/c/**", max_bytes=1024).literal_prefix == "a/b"


def test_configuration_hash_ignores_spelling_not_meaning():
    m = SubscriptionManager(store=None)
    a = m.parse(
        {
            "type": "webhook",
            "pattern": "/e/*/",
            "streams": ["b", "a", "b"],
            "webhook": {"url": "https://x.example/h"},
            "unknown": 1,
        }
    )
    b = m.parse(
        {
            "type": "webhook",
            "pattern": "e/*",
            "streams": ["a", "/b"],
            "webhook": {"url": "https://x.example/h"},
            "lease_ttl_ms": 30000.0,
        }
    )
    assert a.hash() == b.hash()
    c = m.parse(
        {
            "type": "webhook",
            "pattern": "e/*",
            "streams": ["a", "b"],
            "webhook": {"url": "https://x.example/h"},
            "lease_ttl_ms": 30001,
        }
    )
    assert c.hash() != a.hash()


def test_tokens_are_bound_to_their_secret_and_claims():
    secret = tokens.new_secret()
    claims = tokens.TokenClaims("s", tokens.CALLBACK, 3, "w_1")
    token = tokens.issue(secret, claims)
    assert tokens.verify(secret, token) == claims
    assert tokens.verify(tokens.new_secret(), token) is None
    head, mac = token.split(".")
    other = tokens.issue(secret, tokens.TokenClaims("s", tokens.CALLBACK, 4, "w_1"))
    assert tokens.verify(secret, other.split(".")[0] + "." + mac) is None
    for junk in ["", ".", "a.b", head, "x" * 5000, "!!.??"]:
        assert tokens.verify(secret, junk) is None


def signature(token: str) -> bytes:
    mac = token.split(".")[1]
    return base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4))


def test_a_token_is_good_only_exactly_as_issued():
    """The signature's last base64 character has two bits a decoder ignores: another
    text with the same bytes is not the token that was issued."""
    secret = tokens.new_secret()
    token = tokens.issue(secret, tokens.TokenClaims("s", tokens.CALLBACK, 3, "w_1"))
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
    twin = token[:-1] + alphabet[alphabet.index(token[-1]) ^ 1]
    assert signature(twin) == signature(token)
    assert tokens.verify(secret, twin) is None


@pytest.fixture
async def store(tmp_path):
    s = StreamStore(tmp_path / "data")
    await s.start()
    yield s
    await s.stop()


async def test_links_cursors_and_saved_values(store: StreamStore):
    m = SubscriptionManager(store)
    store.events.on_created = m.stream_created
    store.events.on_appended = m.stream_appended
    store.events.on_deleted = m.stream_deleted
    kicked: list[str] = []
    m.kick = kicked.append
    await store.create(CreateRequest("e/old", JSON, b'[{"a":1},{"a":2}]'))
    config = m.parse(
        {"type": "pull-wake", "pattern": "e/*", "streams": ["x/explicit"], "wake_stream": "e/wake"}
    )
    sub, created = await m.create("s", config)
    assert created and (await m.create("s", config))[1] is False
    assert {p: (k.acked, k.link_type) for p, k in sub.links.items()} == {
        "e/old": (2, "glob"),  # backfilled at its tail: history is not replayed
        "x/explicit": (0, "explicit"),
    }
    assert not m.has_pending(sub)

    await store.create(CreateRequest("e/wake", JSON))  # its own wake stream is never linked
    await store.create(CreateRequest("e/new", JSON, b'{"a":1}'))
    assert sub.links["e/new"].acked == 0 and "e/wake" not in sub.links
    assert "s" in kicked and m.pending(sub) == [("e/new", 0, 1)]

    await store.append(AppendRequest("e/old", JSON, b'{"a":3}'))
    wake = m.issue_wake(sub, now=100.0)
    assert wake is not None and wake.generation == 1
    assert wake.snapshot == {"e/new": 1, "e/old": 3}
    m.apply_acks(sub, [Ack("e/old", 3), Ack("e/new", 1)])
    m.apply_acks(sub, [Ack("e/old", 1)])  # a cursor never moves back
    assert sub.links["e/old"].acked == 3

    with pytest.raises(SubscriptionError) as info:
        m.parse_acks(
            sub, {"acks": [{"stream": "e/old", "offset": "0000000000000000_0000000000000009"}]}
        )
    assert info.value.code == "INVALID_OFFSET"

    # A deleted stream: its glob link goes, an explicit link stays at offset zero.
    await store.create(CreateRequest("x/explicit", JSON, b'{"a":1}'))
    m.apply_acks(sub, [Ack("x/explicit", 1)])
    await store.delete("e/new")
    await store.delete("x/explicit")
    assert "e/new" not in sub.links and sub.links["x/explicit"].acked == 0

    # The saved value holds the whole state, and reads back the same.
    again = from_value(sub.to_value(), max_path_bytes=1024)
    assert isinstance(again, Subscription)
    assert again.to_value() == sub.to_value()
    await m.delete("s")
    tomb = from_value(m.tombstones["s"].to_value(), max_path_bytes=1024)
    assert isinstance(tomb, Tombstone) and tomb.generation == 1
    # Re-created under the same id, the generation continues.
    sub2, _ = await m.create("s", config)
    assert sub2.generation == 1 and sub2.secret != sub.secret


async def test_saved_subscriptions_survive_a_reopen_and_new_streams_are_linked(tmp_path):
    store = StreamStore(tmp_path / "data")
    await store.start()
    m = SubscriptionManager(store)
    await m.create("s", m.parse({"type": "pull-wake", "pattern": "e/*", "wake_stream": "w"}))
    await store.stop()
    # A stream created while no manager watched (as between recovery and load).
    store = StreamStore(tmp_path / "data")
    await store.start()
    await store.create(CreateRequest("e/late", JSON, b'{"a":1}'))
    m2 = SubscriptionManager(store)
    await m2.load()
    sub = m2.get("s")
    assert sub.links["e/late"].acked == 0 and m2.has_pending(sub)
    await store.stop()
