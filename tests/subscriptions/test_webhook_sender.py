"""The webhook sender against real receivers on loopback: signatures, pinning, refusals.

Receivers are real HTTP(S) servers on 127.0.0.x. Names such as
``hooks.example`` reach them through the sender's resolver hook (the one
seam: the machine has no DNS of its own), so the tests can show that the
sender connects to the address it checked, with the name in ``Host`` and in
the TLS server name, and that a name whose answer turns private is refused at
send time. All traffic stays on loopback. The example receiver, run as its own
process, is in test_programs.py.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from nacl.signing import VerifyKey

from stream_server.subscriptions.signing import WebhookKeys
from stream_server.subscriptions.urls import WebhookAllowList
from stream_server.subscriptions.webhook_sender import WebhookSender

pytestmark = pytest.mark.processes

NONE = WebhookAllowList.from_settings([])


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A real HTTP/1.1 server (keep-alive) that records requests and answers as told."""

    host: str = "127.0.0.1"
    tls: ssl.SSLContext | None = None
    status: int = 200
    reply: bytes = b"{}"
    reply_headers: dict[str, str] = field(
        default_factory=lambda: {"Content-Type": "application/json"}
    )
    seen: list[Seen] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.seen.append(Seen(self.path, dict(self.headers.items()), body))
                self.send_response(outer.status)
                for k, v in outer.reply_headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(outer.reply)))
                self.end_headers()
                self.wfile.write(outer.reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        self.port = self.server.server_address[1]
        if self.tls is not None:
            self.tls.sni_callback = lambda sock, name, ctx: self.server_names.append(name)
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def receiving(**kw: Any) -> Iterator[Receiver]:
    r = Receiver(**kw)
    try:
        yield r
    finally:
        r.close()


def certificate(tmp_path: Path, *names: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for ``names``: (server context, client context trusting it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / f"{names[0]}.pem", tmp_path / f"{names[0]}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client


def resolver_of(answers: dict[str, list[str]], asked: list[str] | None = None):
    async def resolve(host: str, port: int) -> list[str]:
        if asked is not None:
            asked.append(host)
        if host not in answers:
            raise OSError(f"unknown host {host}")
        return answers[host]

    return resolve


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_from_jwks(jwks: dict, body: bytes, header: str) -> None:
    t, kid, sig = re.fullmatch(r"t=(\d+),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)", header).groups()
    (jwk,) = [k for k in jwks["keys"] if k["kid"] == kid]
    VerifyKey(unb64(jwk["x"])).verify(t.encode() + b"." + body, unb64(sig))


@pytest.fixture
def keys(tmp_path) -> WebhookKeys:
    return WebhookKeys.load_or_create(tmp_path / "webhook-keys")


BODY = json.dumps({"subscription_id": "sub-1", "wake_id": "w_1", "generation": 1}).encode()


async def test_a_signed_post_reaches_the_receiver_and_its_answer_comes_back(keys):
    with receiving(reply=b'{"done": true}') as r:
        sender = WebhookSender(keys, NONE, timeout=10)
        try:
            d = await sender.send(f"http://127.0.0.1:{r.port}/webhook?x=1", BODY)
        finally:
            await sender.aclose()
    assert d.ok and d.status == 200 and d.json == {"done": True} and d.error is None
    assert d.outcome == "ok" and d.address == "127.0.0.1"
    (seen,) = r.seen
    assert seen.path == "/webhook?x=1" and seen.body == BODY
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["Host"] == f"127.0.0.1:{r.port}"
    verify_from_jwks(keys.jwks(), seen.body, seen.headers["Webhook-Signature"])


async def test_redirects_are_not_followed_and_odd_answers_are_not_parsed(keys):
    sender = WebhookSender(keys, NONE, timeout=10, max_response_bytes=1000)
    try:
        with receiving(status=307, reply=b"", reply_headers={"Location": "http://10.0.0.1/x"}) as r:
            d = await sender.send(f"http://127.0.0.1:{r.port}/a", BODY)
            assert (d.ok, d.status, d.outcome) == (False, 307, "http_error")
            assert len(r.seen) == 1  # nothing followed the Location
        with receiving(reply=b'{"done": true,' + b" " * 1000 + b"}") as r:
            d = await sender.send(f"http://127.0.0.1:{r.port}/a", BODY)
            assert d.ok and d.json is None  # over the cap: not parsed
        with receiving(reply=b"[1, 2]") as r:
            assert (await sender.send(f"http://127.0.0.1:{r.port}/a", BODY)).json is None
        with receiving(reply=b"not json") as r:
            assert (await sender.send(f"http://127.0.0.1:{r.port}/a", BODY)).json is None
        with receiving(status=500, reply=b'{"done": true}') as r:
            d = await sender.send(f"http://127.0.0.1:{r.port}/a", BODY)
            assert not d.ok and d.status == 500 and "500" in (d.error or "")
    finally:
        await sender.aclose()


async def test_unsafe_urls_are_refused_without_a_connection(keys):
    with receiving(host="127.0.1.7") as r:
        sender = WebhookSender(keys, NONE, timeout=10)
        try:
            for url in [f"http://127.0.1.7:{r.port}/", f"https://127.0.1.7:{r.port}/"]:
                d = await sender.send(url, BODY)
                assert d.rejected and d.outcome == "rejected" and d.status is None
        finally:
            await sender.aclose()
        assert r.seen == []


async def test_the_allow_list_opens_a_non_public_range(keys):
    """127.0.1.0/24 is loopback but outside the 127.0.0.x development exception: refused
    above, delivered once the operator lists it."""
    allow = WebhookAllowList.from_settings(["127.0.1.0/24"])
    with receiving(host="127.0.1.7") as r:
        sender = WebhookSender(keys, allow, timeout=10)
        try:
            d = await sender.send(f"http://127.0.1.7:{r.port}/in-cluster", BODY)
        finally:
            await sender.aclose()
    assert d.ok and [s.path for s in r.seen] == ["/in-cluster"]


async def test_a_name_whose_answer_turns_private_is_refused_at_send_time(keys):
    """DNS rebinding: the first answer is the allowed receiver, the next one a private
    address; the second send is refused before any connection."""
    answers = iter([["127.0.1.7"], ["10.0.0.5"]])
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return next(answers)

    allow = WebhookAllowList.from_settings(["127.0.1.0/24"])
    with receiving(host="127.0.1.7") as r:
        sender = WebhookSender(keys, allow, timeout=10, resolver=rebinding)
        try:
            first = await sender.send(f"https://rebind.test:{r.port}/h", BODY)
            second = await sender.send(f"https://rebind.test:{r.port}/h", BODY)
        finally:
            await sender.aclose()
    assert asked == ["rebind.test", "rebind.test"]  # resolved at every delivery
    assert not first.rejected  # reached 127.0.1.7 (no TLS there, so it failed later)
    assert second.rejected and "10.0.0.5" in (second.error or "")


async def test_https_connects_to_the_checked_address_with_the_name_in_host_and_sni(keys, tmp_path):
    server_tls, client_tls = certificate(tmp_path, "hooks.example", "other.example")
    allow = WebhookAllowList.from_settings(["127.0.1.0/24"])
    resolve = resolver_of({"hooks.example": ["127.0.1.7"], "other.example": ["127.0.1.7"]})
    with receiving(host="127.0.1.7", tls=server_tls, reply=b'{"done": true}') as r:
        sender = WebhookSender(keys, allow, timeout=10, resolver=resolve, verify=client_tls)
        try:
            for name in ["hooks.example", "hooks.example", "other.example", "hooks.example"]:
                d = await sender.send(f"https://{name}:{r.port}/hook", BODY)
                assert d.ok and d.json == {"done": True} and d.address == "127.0.1.7", d
        finally:
            await sender.aclose()
    hosts = [s.headers["Host"] for s in r.seen]
    names = ["hooks.example", "hooks.example", "other.example", "hooks.example"]
    assert hosts == [f"{n}:{r.port}" for n in names]
    # One TLS connection per name, each with its own server name: a connection made for
    # hooks.example is never reused for other.example.
    assert r.server_names == ["hooks.example", "other.example"]


async def test_the_certificate_is_checked_against_the_name_not_the_address(keys, tmp_path):
    server_tls, client_tls = certificate(tmp_path, "someone-else.example")
    allow = WebhookAllowList.from_settings(["127.0.1.0/24"])
    resolve = resolver_of({"hooks.example": ["127.0.1.7"]})
    with receiving(host="127.0.1.7", tls=server_tls) as r:
        sender = WebhookSender(keys, allow, timeout=10, resolver=resolve, verify=client_tls)
        try:
            d = await sender.send(f"https://hooks.example:{r.port}/hook", BODY)
        finally:
            await sender.aclose()
    assert not d.ok and d.status is None and "certificate" in (d.error or "").lower()
    assert r.seen == []


async def test_the_next_address_is_tried_when_one_refuses_connections(keys):
    with socket.socket() as unused:
        unused.bind(("127.0.0.2", 0))
        with receiving() as r:
            port = r.port
            # Nothing listens on 127.0.0.2:<port> (we hold that port without listening).
            unused.close()
            allow = WebhookAllowList.from_settings(["multi.test"])
            resolve = resolver_of({"multi.test": ["127.0.0.2", "127.0.0.1"]})
            sender = WebhookSender(keys, allow, timeout=10, resolver=resolve)
            try:
                d = await sender.send(f"http://multi.test:{port}/h", BODY)
            finally:
                await sender.aclose()
    assert d.ok and d.address == "127.0.0.1" and r.seen[0].headers["Host"] == f"multi.test:{port}"


async def test_a_receiver_that_never_answers_is_a_timeout(keys):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        sender = WebhookSender(keys, NONE, timeout=0.5)
        try:
            d = await sender.send(f"http://127.0.0.1:{listener.getsockname()[1]}/", BODY)
        finally:
            await sender.aclose()
    assert (d.ok, d.status, d.outcome) == (False, None, "timeout")


async def test_nothing_listening_is_a_network_error(keys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sender = WebhookSender(keys, NONE, timeout=10)
    try:
        d = await sender.send(f"http://127.0.0.1:{port}/", BODY)
    finally:
        await sender.aclose()
    assert (d.ok, d.status, d.outcome) == (False, None, "network_error") and d.error
