"""A corpus of streams written through HTTP by a real server, and protocol reads of it.

Everything the Spark source returns is checked against what the server
itself answers on HTTP, never against what the test believes it wrote.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import httpx

from stream_format.offsets import format_offset, parse_offset

OCTET = {"Content-Type": "application/octet-stream"}
TEXT = {"Content-Type": "text/plain; charset=utf-8"}
JSON = {"Content-Type": "application/json"}


@dataclass
class Corpus:
    """What was written, as far as the tests need to know it."""

    base: str  # http://127.0.0.1:PORT/v1/stream/
    readable: list[str] = field(default_factory=list)  # streams a default read returns
    soft_deleted: list[str] = field(default_factory=list)
    json_streams: list[str] = field(default_factory=list)
    orders: list[dict] = field(default_factory=list)  # messages of json/orders
    producers: dict[str, set[str]] = field(default_factory=dict)  # stream -> producer ids


def _ok(r: httpx.Response) -> httpx.Response:
    assert r.status_code < 300, (r.status_code, r.request.method, r.request.url, r.text)
    return r


def put(c: httpx.Client, path: str, headers: dict, body: bytes = b"") -> httpx.Response:
    return _ok(c.put(path, headers=headers, content=body))


def post(c: httpx.Client, path: str, headers: dict, body: bytes) -> httpx.Response:
    return _ok(c.post(path, headers=headers, content=body))


def write_corpus(base: str) -> Corpus:
    """Binary, text and JSON streams; closed ones; forks (one at a sub-offset,
    one of a fork); idempotent producers with a retried append; a soft-deleted
    source that a fork still reads through."""
    rnd = random.Random(6)
    corpus = Corpus(base)
    with httpx.Client(base_url=base, timeout=30) as c:
        # A long binary stream: many records over many index granules (16 KiB),
        # so that a small partition size splits it.
        put(c, "bin/big", OCTET)
        for _ in range(90):
            post(c, "bin/big", OCTET, rnd.randbytes(rnd.randint(1, 24 * 1024)))
        put(c, "bin/small", OCTET, b"created-with-body")
        for i in range(5):
            post(c, "bin/small", OCTET, bytes([i]) * (10 + i))
        put(c, "text/log", TEXT)
        for i in range(20):
            post(c, "text/log", TEXT, f"line {i}: h\u00e9llo w\u00f6rld\n".encode())
        put(c, "json/events", JSON, b"[]")
        post(
            c,
            "json/events",
            JSON,
            json.dumps([{"n": 0}, {"n": 1, "s": "\u00fcn\u00efcode"}]).encode(),
        )
        post(c, "json/events", JSON, b'{"n": 2, "nested": {"a": [1, 2, {"b": null}]}}')
        post(c, "json/events", JSON, b'[3, "four", 5.5, true, null]')
        for i in range(4):
            headers = JSON | {"Producer-Id": "jp", "Producer-Epoch": "0", "Producer-Seq": str(i)}
            post(c, "json/events", headers, json.dumps({"n": 10 + i}).encode())
        corpus.producers["json/events"] = {"jp"}
        put(c, "json/orders", JSON)
        for i in range(30):
            order = {
                "user": {"id": 1000 + i % 7},
                "amount": round(i * 1.25, 2),
                "sku": f"sku-{i % 5}",
            }
            if i % 10 == 3:
                del order["sku"]  # a missing field extracts as null
            corpus.orders.append(order)
        for i in range(0, 30, 6):
            post(c, "json/orders", JSON, json.dumps(corpus.orders[i : i + 6]).encode())
        # Closed streams: one closed by its last append, one created closed and empty.
        put(c, "closed/one", TEXT)
        post(c, "closed/one", TEXT, b"first\n")
        post(c, "closed/one", TEXT | {"Stream-Closed": "true"}, b"last\n")
        put(c, "closed/empty", TEXT | {"Stream-Closed": "true"})
        # Idempotent producers, with a retried append that must not be stored twice.
        put(c, "prod/p", OCTET)
        for pid, epoch, seqs in (
            ("alpha", 0, [0, 1, 1, 2]),
            ("beta", 3, [0, 1]),
            ("alpha", 1, [0]),
        ):
            for seq in seqs:
                headers = OCTET | {
                    "Producer-Id": pid,
                    "Producer-Epoch": str(epoch),
                    "Producer-Seq": str(seq),
                }
                post(c, "prod/p", headers, f"{pid}/{epoch}/{seq};".encode())
        post(c, "prod/p", OCTET, b"no-producer;")
        corpus.producers["prod/p"] = {"alpha", "beta"}
        # Forks of bin/small: bin/small holds 17 bytes then records of 10..14 bytes.
        put(
            c,
            "fork/at",
            {"Stream-Forked-From": "bin/small", "Stream-Fork-Offset": format_offset(27)},
        )
        post(c, "fork/at", OCTET, b"own-of-fork-at")
        sub = {
            "Stream-Forked-From": "/v1/stream/bin/small",
            "Stream-Fork-Offset": format_offset(38),
            "Stream-Fork-Sub-Offset": "5",  # inside the 12-byte record at 38..50
        }
        put(c, "fork/sub", sub)
        post(c, "fork/sub", OCTET, b"SUB1")
        post(c, "fork/sub", OCTET, b"SUB2-longer")
        # A fork of the sub-offset fork, itself cut inside the inherited part.
        put(
            c,
            "fork/sub/deeper",
            {
                "Stream-Forked-From": "fork/sub",
                "Stream-Fork-Offset": format_offset(40),
            },
        )
        post(c, "fork/sub/deeper", OCTET, b"DEEP")
        put(
            c,
            "fork/json",
            {"Stream-Forked-From": "json/events", "Stream-Fork-Offset": format_offset(3)},
        )
        post(c, "fork/json", JSON, b'{"fork": true}')
        # A deleted source that a fork still reads through: soft-deleted (410).
        put(c, "del/src", TEXT, b"inherited ")
        post(c, "del/src", TEXT, b"by the fork ")
        put(c, "del/fork", {"Stream-Forked-From": "del/src"})
        post(c, "del/fork", TEXT, b"and its own")
        assert c.delete("del/src").status_code == 204
        assert c.get("del/src").status_code == 410
        # A stream with a TTL: readable now, expired for a cut taken two hours later.
        put(c, "ttl/hour", TEXT | {"Stream-TTL": "3600"}, b"expires in an hour")
    corpus.readable = [
        "bin/big",
        "bin/small",
        "closed/empty",
        "closed/one",
        "del/fork",
        "fork/at",
        "fork/json",
        "fork/sub",
        "fork/sub/deeper",
        "json/events",
        "json/orders",
        "prod/p",
        "text/log",
        "ttl/hour",
    ]
    corpus.soft_deleted = ["del/src"]
    corpus.json_streams = ["fork/json", "json/events", "json/orders"]
    return corpus


@dataclass
class HttpRead:
    """A whole catch-up read: the bytes (or JSON messages) and the final offset."""

    content_type: str
    data: bytes  # binary/text streams: every byte; JSON: empty
    messages: list[bytes]  # JSON streams: each message's exact bytes
    tail: int
    closed: bool


def http_read(c: httpx.Client, path: str, start: int = 0) -> HttpRead:
    """Catch-up reads from ``start`` until Stream-Up-To-Date."""
    offset = "-1" if start == 0 else format_offset(start)
    data = bytearray()
    messages: list[bytes] = []
    while True:
        r = c.get(path, params={"offset": offset})
        assert r.status_code == 200, (path, r.status_code, r.text)
        ct = r.headers["content-type"]
        if ct.startswith("application/json"):
            messages.extend(split_json_array(r.content))
        else:
            data += r.content
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return HttpRead(
                ct,
                bytes(data),
                messages,
                parse_offset(offset),
                r.headers.get("stream-closed") == "true",
            )


def split_json_array(body: bytes) -> list[bytes]:
    """The exact bytes of each element of a JSON array body (the server's framing)."""
    text = body.decode()
    assert text[0] == "[" and text[-1] == "]", text[:80]
    decoder = json.JSONDecoder()
    out: list[bytes] = []
    i = 1
    while i < len(text) - 1:
        _, end = decoder.raw_decode(text, i)
        out.append(text[i:end].encode())
        i = end
        if text[i] == ",":
            i += 1
    return out
