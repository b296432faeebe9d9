"""Streams of every kind and a subscription, written through one URL and checked anywhere.

A change to a replica set (a scale-up, a scale-down, a roll) must keep every acknowledged
byte of every kind of state the server holds, not only plain appends: a text stream, a
JSON stream (messages, not bytes), an idempotent producer's stream (its producer state:
a retried ``Producer-Seq`` is a duplicate), a closed stream (still closed), a fork (its
source's prefix and its own appends, and still a fork of that source) and a
subscription (its configuration and links). ``StreamKinds`` writes a round of each
through a client-facing URL (a Service), remembers what was acknowledged, and checks
it at any server: the primary (where writes may be tried again) or a standby (reads
only: a standby answers writes 503).

Everything is plain HTTP against the Durable Streams protocol; nothing here knows
about Kubernetes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

OCTET = {"Content-Type": "application/octet-stream"}
JSON = {"Content-Type": "application/json"}
TEXT = "kinds/text"
JSON_STREAM = "kinds/json"
PRODUCED = "kinds/producer"
CLOSED = "kinds/closed"
FORK = "kinds/fork"
WAKE = "kinds/wake"
WATCHED = "watched/a"
SUBSCRIPTION = "keeper"
PRODUCER = {"Producer-Id": "keeper-producer", "Producer-Epoch": "0"}
# What a subscription's GET shows that depends on its activity, not on its configuration.
_VOLATILE = ("status", "generation")


class Refused(AssertionError):
    """The server did not acknowledge a write the round needs (the caller may retry the
    round's step on another server; nothing is recorded as acknowledged)."""


def _ok(r: httpx.Response, *codes: int) -> httpx.Response:
    if r.status_code not in codes:
        raise Refused(f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:300]}")
    return r


def read(client: httpx.Client, base: str, path: str) -> tuple[bytes, dict[str, str]] | None:
    """A stream's whole content and its last answer's headers, following
    Stream-Next-Offset until up to date; None unless every answer is 200."""
    out, offset, headers = b"", "-1", {}
    while True:
        r = client.get(f"{base}/v1/stream/{path}", params={"offset": offset})
        if r.status_code != 200:
            return None
        out += r.content
        headers = dict(r.headers)
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out, headers


@dataclass
class StreamKinds:
    """What was acknowledged of each kind, round by round (``write_round``)."""

    text: bytes = b""
    messages: list[Any] = field(default_factory=list)
    produced: bytes = b""
    seq: int = -1  # the producer's last acknowledged Producer-Seq
    closed: bytes = b""
    fork_base: bytes = b""  # the source's content at the fork offset
    fork_own: bytes = b""
    fork_offset: str = ""
    subscription: dict[str, Any] | None = None
    rounds: int = 0

    def write_round(self, client: httpx.Client, base: str) -> None:
        """One round of writes through ``base`` (the primary, or a Service selecting it).

        The first round creates every stream (the closed one closed at once, the fork
        branched from the text stream's tail) and the subscription; every round appends
        to the text, JSON, producer and fork streams. What is recorded is what was
        acknowledged; a refusal raises ``Refused`` before anything of that write is."""
        r = self.rounds
        url = f"{base}/v1/stream"
        if r == 0:
            for path, headers in ((TEXT, OCTET), (JSON_STREAM, JSON), (PRODUCED, OCTET)):
                _ok(client.put(f"{url}/{path}", headers=headers), 200, 201)
            _ok(client.put(f"{url}/{WAKE}", headers=JSON), 200, 201)
            _ok(client.put(f"{url}/{WATCHED}", headers=OCTET), 200, 201)
            _ok(client.put(f"{url}/{CLOSED}", headers=OCTET), 200, 201)
            body = b"the last words\n"
            _ok(client.post(f"{url}/{CLOSED}", content=body, headers=OCTET), 200, 204)
            self.closed = body
            closing = OCTET | {"Stream-Closed": "true"}
            _ok(client.post(f"{url}/{CLOSED}", content=b"", headers=closing), 200, 204)
        chunk = f"text round {r}: {'x' * (r * 37 % 50)}\n".encode()
        _ok(client.post(f"{url}/{TEXT}", content=chunk, headers=OCTET), 200, 204)
        self.text += chunk
        batch = [{"round": r, "n": i, "note": "é" * i} for i in range(3)]
        _ok(client.post(f"{url}/{JSON_STREAM}", content=json.dumps(batch), headers=JSON), 200, 204)
        self.messages += batch
        for _ in range(2):
            seq, data = self.seq + 1, f"produced {self.seq + 1}\n".encode()
            headers = OCTET | PRODUCER | {"Producer-Seq": str(seq)}
            _ok(client.post(f"{url}/{PRODUCED}", content=data, headers=headers), 200, 204)
            self.produced, self.seq = self.produced + data, seq
        if r == 0:
            tail = _ok(client.head(f"{url}/{TEXT}"), 200).headers["stream-next-offset"]
            fork = OCTET | {"Stream-Forked-From": TEXT, "Stream-Fork-Offset": tail}
            _ok(client.put(f"{url}/{FORK}", headers=fork), 201)
            self.fork_offset, self.fork_base = tail, self.text
            config = {"type": "pull-wake", "pattern": "watched/**", "wake_stream": WAKE}
            _ok(client.put(f"{url}/__ds/subscriptions/{SUBSCRIPTION}", json=config), 201)
            got = _ok(client.get(f"{url}/__ds/subscriptions/{SUBSCRIPTION}"), 200).json()
            self.subscription = {k: v for k, v in got.items() if k not in _VOLATILE}
        own = f"fork round {r}\n".encode()
        _ok(client.post(f"{url}/{FORK}", content=own, headers=OCTET), 200, 204)
        self.fork_own += own
        self.rounds += 1

    def differences(self, client: httpx.Client, base: str) -> list[str]:
        """What the server at ``base`` shows differently from what was acknowledged
        (empty: everything is there, byte for byte). Reads only: fit for a standby."""
        wrong: list[str] = []

        def content(path: str) -> tuple[bytes, dict[str, str]] | None:
            got = read(client, base, path)
            if got is None:
                wrong.append(f"{path}: not served")
            return got

        for path, want in ((TEXT, self.text), (PRODUCED, self.produced)):
            if (got := content(path)) is not None and got[0] != want:
                wrong.append(f"{path}: {len(got[0])} bytes, acknowledged {len(want)}")
        if (got := content(JSON_STREAM)) is not None and json.loads(got[0]) != self.messages:
            many = len(json.loads(got[0]))
            wrong.append(f"{JSON_STREAM}: {many} messages, acknowledged {len(self.messages)}")
        closed = content(CLOSED)
        if closed is not None and (closed[0], closed[1].get("stream-closed")) != (
            self.closed,
            "true",
        ):
            wrong.append(f"{CLOSED}: {closed[0]!r} closed={closed[1].get('stream-closed')}")
        forked = self.fork_base + self.fork_own
        if (got := content(FORK)) is not None and got[0] != forked:
            wrong.append(f"{FORK}: {len(got[0])} bytes, acknowledged {len(forked)}")
        r = client.get(f"{base}/v1/stream/__ds/subscriptions/{SUBSCRIPTION}")
        seen = {k: v for k, v in r.json().items() if k not in _VOLATILE} if r.is_success else r.text
        if seen != self.subscription:
            wrong.append(f"subscription {SUBSCRIPTION}: {r.status_code} {seen}")
        return wrong

    def primary_differences(self, client: httpx.Client, base: str) -> list[str]:
        """``differences``, then the writes that must change nothing on the primary: the
        producer's last append again is a duplicate (204), an append to the closed stream
        is refused (409), the fork created again with the same source and offset is the
        same stream (200), the subscription created again with its configuration too."""
        wrong = self.differences(client, base)
        if wrong:
            return wrong
        url = f"{base}/v1/stream"
        data = f"produced {self.seq}\n".encode()
        headers = OCTET | PRODUCER | {"Producer-Seq": str(self.seq)}
        r = client.post(f"{url}/{PRODUCED}", content=data, headers=headers)
        if r.status_code != 204:
            wrong.append(f"{PRODUCED}: seq {self.seq} again answered {r.status_code}, not 204")
        r = client.post(f"{url}/{CLOSED}", content=b"more", headers=OCTET)
        if r.status_code != 409:
            wrong.append(f"{CLOSED}: an append answered {r.status_code}, not 409")
        fork = OCTET | {"Stream-Forked-From": TEXT, "Stream-Fork-Offset": self.fork_offset}
        r = client.put(f"{url}/{FORK}", headers=fork)
        if r.status_code != 200:
            wrong.append(f"{FORK}: created again as a fork answered {r.status_code}, not 200")
        assert self.subscription is not None
        config = {"type": "pull-wake", "pattern": "watched/**", "wake_stream": WAKE}
        r = client.put(f"{url}/__ds/subscriptions/{SUBSCRIPTION}", json=config)
        if r.status_code != 200:
            wrong.append(f"subscription {SUBSCRIPTION}: created again answered {r.status_code}")
        return wrong + self.differences(client, base)
