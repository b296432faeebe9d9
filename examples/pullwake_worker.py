"""A pull-wake worker: run several of these and they share one subscription's work.

Each worker long-polls the subscription's wake stream; on a wake event it
races the others to claim the lease. The winner reads every stream the claim
lists from its acked offset up to the tail the claim names, prints what it
read, and acks with ``done``; the losers get 409 and go back to waiting. A
worker that dies mid-work simply stops heartbeating: its lease runs out and
the server writes a new wake event for the others.

Standard library only::

    python examples/pullwake_worker.py --base http://127.0.0.1:4437/v1/stream/ \\
        --subscription pool --name worker-1

(create the wake stream and the subscription first; docs/subscriptions.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any


def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None), r.headers
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else None), e.headers


def work(base: str, sub: str, name: str) -> bool:
    """Claim the subscription and do its work; False when another worker has it."""
    status, lease, _ = call("POST", f"{base}__ds/subscriptions/{sub}/claim", {"worker": name})
    if status != 200:
        return False  # ALREADY_CLAIMED or NO_PENDING_WORK
    acks = []
    for s in lease["streams"]:
        offset, tail = s["acked_offset"], s["tail_offset"]
        while offset < tail:  # offsets sort as strings
            _, data, headers = call("GET", f"{base}{s['path']}?offset={offset}")
            for message in data if isinstance(data, list) else [data]:
                print(f"{name}: {s['path']}: {json.dumps(message)}", flush=True)
            offset = min(headers["Stream-Next-Offset"], tail)
        acks.append({"stream": s["path"], "offset": tail})
        # A long job would heartbeat here: POST .../ack without "done".
    body = {"wake_id": lease["wake_id"], "generation": lease["generation"], "acks": acks,
            "done": True}  # fmt: skip
    status, answer, _ = call("POST", f"{base}__ds/subscriptions/{sub}/ack", body, lease["token"])
    print(f"{name}: acked generation {lease['generation']}: {status} {answer}", flush=True)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="http://127.0.0.1:4437/v1/stream/")
    p.add_argument("--subscription", required=True)
    p.add_argument("--name", required=True)
    args = p.parse_args()
    base = args.base if args.base.endswith("/") else args.base + "/"
    _, config, _ = call("GET", f"{base}__ds/subscriptions/{args.subscription}")
    wake_stream = config["wake_stream"]
    while work(base, args.subscription, args.name):  # work left from before we started
        pass
    offset = "now"
    while True:
        status, events, headers = call("GET", f"{base}{wake_stream}?offset={offset}&live=long-poll")
        offset = headers.get("Stream-Next-Offset", offset)
        for event in (events or []) if status == 200 else []:
            if event.get("subscription_id") == args.subscription:
                work(base, args.subscription, args.name)


if __name__ == "__main__":
    sys.exit(main())
