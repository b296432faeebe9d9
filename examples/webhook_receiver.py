"""A webhook receiver for Durable Streams subscriptions that checks every signature.

Run it next to a server (Python 3.11+, ``pip install cryptography``)::

    python examples/webhook_receiver.py \\
        --jwks-url http://127.0.0.1:4437/v1/stream/__ds/jwks.json --port 8080

and point a subscription at it (``"webhook": {"url": "http://localhost:8080/hook"}``).
For each POST it:

1. reads the raw body (the signature covers the exact bytes, so never
   re-serialise JSON before checking);
2. parses ``Webhook-Signature: t=<unix>,kid=<kid>,ed25519=<base64url>``,
   refuses a timestamp more than ``--tolerance`` seconds (default 300) from
   its clock, and refuses a signature it has already accepted (a replay);
3. picks the public key by ``kid`` from the server's JWKS (fetched again,
   at most every ``--refetch-every`` seconds, when a kid is unknown: the server rotated its key);
4. verifies Ed25519 over ``<t>.<raw body>``;
5. prints the wake as one JSON line on stdout and answers ``{"done": true}``,
   which tells the server to ack the wake's tail offsets. A receiver that
   works asynchronously answers 200 without ``done`` and later calls
   ``callback_url`` with ``Authorization: Bearer <callback_token>``.

Anything that fails verification gets 401 (409 for a replay) and is not
processed. It uses only the standard library and ``cryptography``.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

SIGNATURE = re.compile(r"^t=(\d+),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)$")
MAX_BODY = 1024 * 1024


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Rejected(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class KeySet:
    """The server's public keys by kid, refreshed from the JWKS when a kid is unknown."""

    def __init__(self, url: str, refetch_every: float) -> None:
        self.url = url
        self.refetch_every = refetch_every  # an unknown kid must not make us hammer the server
        self.keys: dict[str, Ed25519PublicKey] = {}
        self.fetched_at = float("-inf")
        self.lock = threading.Lock()

    def fetch(self) -> None:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            doc = json.load(response)
        keys = {}
        for jwk in doc.get("keys", []):
            if jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519" and "kid" in jwk:
                keys[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"]))
        self.keys = keys
        self.fetched_at = time.monotonic()

    def get(self, kid: str) -> Ed25519PublicKey:
        with self.lock:
            if kid not in self.keys and time.monotonic() - self.fetched_at >= self.refetch_every:
                self.fetch()
            key = self.keys.get(kid)
        if key is None:
            raise Rejected(401, f"unknown key id {kid}")
        return key


class Verifier:
    def __init__(self, keys: KeySet, tolerance: float) -> None:
        self.keys = keys
        self.tolerance = tolerance
        self.seen: dict[str, float] = {}  # signature -> when it leaves the replay window
        self.lock = threading.Lock()

    def check(self, header: str | None, body: bytes) -> None:
        match = SIGNATURE.match(header or "")
        if not match:
            raise Rejected(401, "missing or malformed Webhook-Signature")
        t, kid, signature = match.groups()
        now = time.time()
        if abs(now - int(t)) > self.tolerance:
            raise Rejected(401, f"timestamp {t} is outside the {self.tolerance:g} s window")
        try:
            self.keys.get(kid).verify(b64url_decode(signature), t.encode() + b"." + body)
        except InvalidSignature:
            raise Rejected(401, "bad signature") from None
        with self.lock:
            for old in [s for s, until in self.seen.items() if until < now]:
                del self.seen[old]
            if signature in self.seen:
                raise Rejected(409, "replayed request")
            self.seen[signature] = int(t) + self.tolerance


def handler_for(verifier: Verifier) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length", "-1"))
                if not 0 <= length <= MAX_BODY:
                    raise Rejected(413, "body missing or too large")
                body = self.rfile.read(length)
                verifier.check(self.headers.get("Webhook-Signature"), body)
                wake = json.loads(body)
            except Rejected as exc:
                print(f"rejected: {exc.reason}", file=sys.stderr, flush=True)
                self.answer(exc.status, {"error": exc.reason})
                return
            # The work goes here: read each stream from its acked_offset up to tail_offset.
            print(json.dumps(wake), flush=True)
            self.answer(200, {"done": True})

        def answer(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # stdout carries the wakes; keep it clean

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jwks-url", required=True, help="the server's {base}/__ds/jwks.json")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0: any free port")
    parser.add_argument("--tolerance", type=float, default=300.0, help="replay window, seconds")
    parser.add_argument(
        "--refetch-every", type=float, default=10.0, help="least seconds between JWKS fetches"
    )
    args = parser.parse_args(argv)
    keys = KeySet(args.jwks_url, args.refetch_every)
    keys.fetch()
    server = ThreadingHTTPServer(
        (args.host, args.port), handler_for(Verifier(keys, args.tolerance))
    )
    port = server.server_address[1]
    print(f"listening on http://{args.host}:{port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
