"""Subscriptions at scale, in the benchmark (issue 14): one server, three figures.

    python e2e/bench/subscriptions.py                 # 10,000 streams, 1,000 subscriptions
    python e2e/bench/subscriptions.py --streams 100 --subscriptions 10 --rounds 5   # smoke

On one fresh server of ours, in this order:

1. **Wake latency**: a webhook subscription on one stream, its receiver a
   local HTTP server in this process on 127.0.0.1 (the protocol's
   development exception) answering ``{"done": true}``, which acks the wake.
   Each round appends 100 bytes and takes the time from sending the POST to
   the receiver holding the webhook request; before the next round the
   subscription's cursor must have reached the tail (the wake is acked and
   the subscription idle again), so every round is one fresh wake.
2. **Many subscriptions**: ``--subscriptions`` pull-wake subscriptions over
   ``many/*`` with one wake stream. Memory per subscription is the server's
   RSS growth (``testkit.servers.rss_bytes``, with its children) over the
   creates, divided by their number. Then one append to ``many/0`` wakes
   them all: the time until it is answered, and until the wake stream holds
   one wake event per subscription.
3. **One wide subscription**: ``--streams`` streams under ``wide/``, then one
   webhook subscription with pattern ``wide/*`` (it links every one of them
   at its tail): the time of its PUT, and of a GET of it with its size.

Control requests go over one raw keep-alive connection (bench.client); the
streams are created with the epoll fill.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the bench package and testkit
    sys.path[0:1] = [str(Path(__file__).resolve().parents[i]) for i in (1, 2)]

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench import log
from bench.client import BIN, JSON_CT, Conn, create_streams, fill, request_bytes
from bench.machine import raise_fd_limit
from bench.servers import Server, missing
from bench.workloads import percentile
from testkit.servers import rss_bytes
from testkit.webhooks import Receiver

BASE = "/v1/stream/"
SUBS = f"{BASE}__ds/subscriptions/"
KiB, MiB = 1024, 1024 * 1024


def call(
    c: Conn, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)
) -> tuple[int, dict[str, str], bytes]:
    """One control request with a JSON body; (status, headers, body), or RuntimeError."""
    data = json.dumps(body).encode() if body is not None else b""
    status, headers, out = c.request(method, path, JSON_CT if body is not None else None, data)
    if status not in ok:
        raise RuntimeError(f"{method} {path}: {status} {out[:300]!r}")
    return status, headers, out


def acked(c: Conn, sub_id: str) -> dict[str, str]:
    _, _, body = call(c, "GET", f"{SUBS}{sub_id}")
    return {s["path"]: s["acked_offset"] for s in json.loads(body)["streams"]}


@dataclass
class Figures:
    wake_rounds: int
    wake_p50_ms: float
    wake_p99_ms: float
    wake_max_ms: float
    subscriptions: int
    subscription_creates_per_s: float
    kib_per_subscription: float
    rss_before_mib: float
    rss_after_mib: float
    wake_all_append_ms: float
    wake_all_events_ms: float
    wake_events: int
    wide_streams: int
    wide_put_s: float
    wide_get_ms: float
    wide_get_kib: float
    wide_linked: int


def wake_latency(srv: Server, receiver: Receiver, rounds: int, warm: int = 3) -> list[float]:
    """Append -> webhook request received, ms, one fresh wake per round."""
    create_streams(srv, ["lat/0"])
    c = Conn(srv.port)
    try:
        hook = {"type": "webhook", "streams": ["lat/0"], "webhook": {"url": receiver.url}}
        call(c, "PUT", f"{SUBS}lat", hook, ok=(201,))
        lat = []
        for i in range(warm + rounds):
            sent = time.perf_counter()
            status, headers, _ = c.request("POST", f"{BASE}lat/0", BIN, b"w" * 100)
            if status not in (200, 204):
                raise RuntimeError(f"append to lat/0: {status}")
            got = receiver.wait(i + 1).at
            if i >= warm:
                lat.append((got - sent) * 1000)
            tail = headers["stream-next-offset"]
            deadline = time.monotonic() + 30
            while acked(c, "lat").get("lat/0") != tail:  # acked: the next append wakes anew
                if time.monotonic() > deadline:
                    raise RuntimeError(f"wake {i + 1} was never acked")
                time.sleep(0.002)
        return sorted(lat)
    finally:
        c.close()


def many_subscriptions(srv: Server, n: int) -> dict[str, float]:
    """``n`` pull-wake subscriptions: memory each, and one append that wakes them all."""
    assert srv.child is not None and srv.child.proc is not None
    pid = srv.child.proc.pid
    c = Conn(srv.port)
    try:
        call(c, "PUT", f"{BASE}wake/pool", [], ok=(201,))
        create_streams(srv, ["many/0"])
        time.sleep(0.5)
        before = rss_bytes(pid, children=True)
        started = time.perf_counter()
        for i in range(n):
            sub = {"type": "pull-wake", "pattern": "many/*", "wake_stream": "wake/pool"}
            call(c, "PUT", f"{SUBS}many-{i}", sub, ok=(201,))
        creates = n / (time.perf_counter() - started)
        time.sleep(0.5)
        after = rss_bytes(pid, children=True)
        _, headers, _ = c.request("HEAD", f"{BASE}wake/pool")
        offset = headers["stream-next-offset"]

        reader = Conn(srv.port)
        try:
            sent = time.perf_counter()
            status, _, _ = c.request("POST", f"{BASE}many/0", BIN, b"m" * 100)
            answered = time.perf_counter()
            if status not in (200, 204):
                raise RuntimeError(f"append to many/0: {status}")
            woken: set[str] = set()
            deadline = time.monotonic() + 60
            while len(woken) < n and time.monotonic() < deadline:
                path = f"{BASE}wake/pool?offset={offset}&live=long-poll"
                status, headers, body = reader.request("GET", path)
                if status == 200:
                    woken.update(e["subscription_id"] for e in json.loads(body))
                offset = headers.get("stream-next-offset", offset)
            all_woken = time.perf_counter()
        finally:
            reader.close()
        if len(woken) < n:
            raise RuntimeError(f"one append woke {len(woken)} of {n} subscriptions")
        return {
            "subscription_creates_per_s": creates,
            "kib_per_subscription": max(0, after - before) / n / KiB,
            "rss_before_mib": before / MiB,
            "rss_after_mib": after / MiB,
            "wake_all_append_ms": (answered - sent) * 1000,
            "wake_all_events_ms": (all_woken - sent) * 1000,
            "wake_events": len(woken),
        }
    finally:
        c.close()


def wide_subscription(srv: Server, receiver: Receiver, n: int) -> dict[str, float]:
    """One webhook subscription whose pattern matches ``n`` streams: its PUT and GET."""
    puts = fill(srv, (request_bytes("PUT", f"{BASE}wide/{i}", BIN) for i in range(n)), 32)
    if puts.ok != n:
        raise RuntimeError(f"created {puts.ok} of {n} streams under wide/")
    c = Conn(srv.port)
    try:
        hook = {"type": "webhook", "pattern": "wide/*", "webhook": {"url": receiver.url}}
        started = time.perf_counter()
        call(c, "PUT", f"{SUBS}wide", hook, ok=(201,))
        put_s = time.perf_counter() - started
        started = time.perf_counter()
        _, _, body = call(c, "GET", f"{SUBS}wide")
        get_ms = (time.perf_counter() - started) * 1000
        linked = len(json.loads(body)["streams"])
        if linked != n:
            raise RuntimeError(f"the wide subscription links {linked} of {n} streams")
        return {
            "wide_put_s": put_s,
            "wide_get_ms": get_ms,
            "wide_get_kib": len(body) / KiB,
            "wide_linked": linked,
        }
    finally:
        c.close()


def measure(args: argparse.Namespace, workdir: Path) -> Figures:
    srv = Server("ours", workdir)
    receiver = Receiver(answer=lambda hook: (200, {"done": True}))  # acks the wake
    try:
        srv.start()
        log(f"wake latency: {args.rounds} rounds")
        lat = wake_latency(srv, receiver, args.rounds)
        log(f"{args.subscriptions} pull-wake subscriptions")
        many = many_subscriptions(srv, args.subscriptions)
        log(f"one subscription over {args.streams} streams")
        wide = wide_subscription(srv, receiver, args.streams)
    finally:
        srv.cleanup()
        receiver.close()
    return Figures(
        wake_rounds=len(lat),
        wake_p50_ms=percentile(lat, 50),
        wake_p99_ms=percentile(lat, 99),
        wake_max_ms=lat[-1],
        subscriptions=args.subscriptions,
        wide_streams=args.streams,
        **many,  # type: ignore[arg-type]
        **wide,  # type: ignore[arg-type]
    )


def report(f: Figures) -> str:
    rows = [
        (
            f"webhook wake latency, append -> request received, p50 / p99 / max "
            f"({f.wake_rounds} rounds)",
            f"{f.wake_p50_ms:.2f} / {f.wake_p99_ms:.2f} / {f.wake_max_ms:.2f} ms",
        ),
        (
            f"{f.subscriptions:,} pull-wake subscriptions: creates (one connection)",
            f"{f.subscription_creates_per_s:,.0f} /s",
        ),
        (
            "memory per subscription (RSS growth / subscriptions)",
            f"{f.kib_per_subscription:.1f} KiB "
            f"(RSS {f.rss_before_mib:.0f} -> {f.rss_after_mib:.0f} MiB)",
        ),
        (
            f"one append waking all {f.subscriptions:,}: append answered",
            f"{f.wake_all_append_ms:.1f} ms",
        ),
        (
            f"same: all {f.wake_events:,} wake events on the wake stream",
            f"{f.wake_all_events_ms:.1f} ms",
        ),
        (
            f"one webhook subscription matching {f.wide_streams:,} streams: PUT",
            f"{f.wide_put_s * 1000:.1f} ms",
        ),
        (
            f"same: GET ({f.wide_linked:,} streams listed)",
            f"{f.wide_get_ms:.1f} ms, {f.wide_get_kib:,.0f} KiB",
        ),
    ]
    lines = ["| figure | value |", "| --- | ---: |"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, default=10_000, help="streams the wide pattern matches")
    ap.add_argument("--subscriptions", type=int, default=1_000, help="pull-wake subscriptions")
    ap.add_argument("--rounds", type=int, default=200, help="wake latency rounds")
    ap.add_argument("--json", dest="json_out", help="also write every figure to this file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if lacking := missing(["ours"], wrk=False):
        for name, why in lacking.items():
            print(f"missing ({name}): {why}", file=sys.stderr)
        return 2
    raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="ds-subscriptions-") as tmp:
        figures = measure(args, Path(tmp))
    print(report(figures))
    if args.json_out:
        doc = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **asdict(figures),
        }
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
