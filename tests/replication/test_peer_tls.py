"""TLS between replicas with a private CA (issue 24, item 9).

A set serving https with certificates from a CA the system does not know
(cert-manager's CA issuer) replicates once every replica is given that CA
(``--replication-ca-file``); without it every standby's handshake fails with
CERTIFICATE_VERIFY_FAILED, none joins the in-sync set and writes are
refused. Real server processes on the emulated Lease API, over real TLS; the
client certificate (``--replication-cert-file``) is shown presented to a
server that requires one; the settings' files are checked at start, by name.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import shutil
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_server import cli
from stream_server.config import Settings, add_arguments, settings_from
from stream_server.replication.peers import peer_tls
from stream_server.replication.peers.peer_http import PeerError, PeerResponse, open_stream
from stream_server.replication.peers.peer_tls import PeerTls
from testkit.pki import PrivateCA
from testkit.replica_set_processes import RESTARTED, until
from testkit.server_process import ServerProcess
from testkit.stream_reads import read_served
from testkit.worker_counts import WORKER_COUNTS

pytestmark = pytest.mark.processes

TEXT = {"Content-Type": "text/plain"}


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = PrivateCA(root / "ca")
        self.server = self.ca.issue("server", "127.0.0.1")
        self.client = self.ca.issue("client", client=True)
        self.stranger = PrivateCA(root / "other", "other-ca")  # a CA nobody trusts

    def serving(self) -> list[str]:
        return ["--tls-cert", str(self.server.cert), "--tls-key", str(self.server.key)]

    def peers(self) -> list[str]:
        return [
            "--replication-ca-file", str(self.ca.cert),
            "--replication-cert-file", str(self.client.cert),
            "--replication-key-file", str(self.client.key),
        ]  # fmt: skip

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca.cert))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def statuses(c: httpx.Client, servers: list[ServerProcess]) -> dict[str, dict[str, Any]]:
    out = {}
    for i, srv in enumerate(servers):
        with contextlib.suppress(httpx.HTTPError):
            out[f"r{i}"] = c.get(f"{srv.url}/replication").json()
    return out


def _primary_in_sync(c: httpx.Client, servers: list[ServerProcess]) -> ServerProcess | None:
    """The primary, once both its standbys are in sync."""
    for name, st in statuses(c, servers).items():
        if st["role"] == "primary" and len(st["in_sync"]) == 2:
            return servers[int(name[1:])]
    return None


@WORKER_COUNTS
def test_a_set_over_https_with_a_private_ca_replicates(start_set, pki, workers):
    """Through a worker too: it splices a standby's stream to its writer after the TLS
    handshake (``workers/tunnel.py``)."""
    servers = start_set(
        f"peer-tls-{workers}", *pki.serving(), *pki.peers(), "--workers", workers, scheme="https"
    )
    by_name = {f"r{i}": srv for i, srv in enumerate(servers)}
    with httpx.Client(verify=pki.client_context(), timeout=30) as c:
        primary = until(
            "a primary with both standbys in sync over https",
            lambda: _primary_in_sync(c, servers),
        )
        assert isinstance(primary, ServerProcess)
        url = f"{primary.base}over-tls"
        assert c.put(url, headers=TEXT).status_code == 201
        sent = b""
        for i in range(20):
            chunk = f"{i:02d};".encode()
            assert c.post(url, content=chunk, headers=TEXT).status_code == 204
            sent += chunk
        st = c.get(f"{primary.url}/replication").json()
        standbys = sorted(n for n, s in by_name.items() if s is not primary)
        assert sorted(st["in_sync"]) == standbys, st
        assert all(st["followers"][n]["lsn"] == st["durable"]["lsn"] for n in standbys), st
        for name, srv in by_name.items():
            path = f"{srv.base}over-tls"
            until(f"{name} serves the bytes written", lambda p=path: read_served(c, p) == sent)
    for srv in servers:  # each standby had its stream (a refused one falls back to fetches)
        assert "no streams of our version" not in srv.log()


def test_a_wiped_standby_is_copied_again_over_https(start_set, pki):
    """The re-copy's snapshot download checks the primary's certificate with the same CA."""
    servers = start_set(
        "peer-tls-recopy", *pki.serving(), *pki.peers(), scheme="https", timings=RESTARTED
    )
    with httpx.Client(verify=pki.client_context(), timeout=30) as c:
        primary = until("a primary with both in sync", lambda: _primary_in_sync(c, servers))
        assert isinstance(primary, ServerProcess)
        url = f"{primary.base}recopied"
        assert c.put(url, headers=TEXT).status_code == 201
        assert c.post(url, content=b"kept;", headers=TEXT).status_code == 204
        for srv in servers:
            srv.stop()  # all down: after this start no primary holds old frames in memory
        wiped = next(s for s in servers if s is not primary)
        shutil.rmtree(wiped.data_dir)
        for srv in servers:
            srv.start()
        wiped_url = f"{wiped.base}recopied"
        until("the wiped standby holds the stream again", lambda: read_served(c, wiped_url))
        assert read_served(c, wiped_url) == b"kept;"
        assert "re-copy installed" in wiped.log()


def test_without_the_ca_file_the_standbys_never_join(start_set, pki):
    servers = start_set("peer-tls-no-ca", *pki.serving(), "--replication-wait", "1", scheme="https")
    by_name = {f"r{i}": srv for i, srv in enumerate(servers)}
    with httpx.Client(verify=pki.client_context(), timeout=30) as c:

        def refused_everywhere() -> dict[str, dict[str, Any]] | None:
            seen = statuses(c, servers)
            primaries = [n for n, st in seen.items() if st["role"] == "primary"]
            standbys = [st for st in seen.values() if st["role"] == "standby"]
            if len(primaries) != 1 or len(standbys) != 2:
                return None
            if all("CERTIFICATE_VERIFY_FAILED" in str(st["problem"]) for st in standbys):
                return seen
            return None

        seen = until("both standbys refusing the primary's certificate", refused_everywhere)
        assert isinstance(seen, dict)
        (name,) = [n for n, st in seen.items() if st["role"] == "primary"]
        primary = by_name[name]
        assert c.get(f"{primary.url}/replication").json()["in_sync"] == []
        r = c.put(f"{primary.base}never", headers=TEXT)
        assert r.status_code == 503, r.text
        assert "too few replicas in sync" in r.text


# -- the client certificate, against a server that requires one ---------------------------


@contextlib.contextmanager
def mutual_tls_server(pki: Pki) -> Iterator[int]:
    """An https server (127.0.0.1) answering 200 only over a connection whose client
    presented a certificate from ``pki``'s CA; the handshake fails otherwise."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server.cert, pki.server.key)
    ctx.load_verify_locations(pki.ca.cert)
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def get(port: int, tls: PeerTls | None) -> int:
    """The status a standby's stream request gets from the peer (which upgrades nothing)."""
    url = f"https://127.0.0.1:{port}/"
    if tls is None:
        r = await open_stream(url, {}, {}, "pyds-replication/2", within=10)
    else:
        r = await open_stream(url, {}, {}, "pyds-replication/2", within=10, tls=tls.context)
    assert isinstance(r, PeerResponse)
    return r.status


async def test_the_client_certificate_is_presented_to_a_peer_that_requires_one(pki):
    with mutual_tls_server(pki) as port:
        both = Settings(
            replication_ca_file=str(pki.ca.cert),
            replication_cert_file=str(pki.client.cert),
            replication_key_file=str(pki.client.key),
        )
        assert await get(port, PeerTls(both)) == 200
        with pytest.raises(PeerError):  # the CA, but no client certificate
            await get(port, PeerTls(Settings(replication_ca_file=str(pki.ca.cert))))
        with pytest.raises(PeerError, match="CERTIFICATE_VERIFY_FAILED"):
            await get(port, None)  # the system's CAs: the old behaviour


def test_a_changed_ca_file_is_loaded_and_a_bad_one_keeps_the_last(pki, tmp_path, monkeypatch):
    monkeypatch.setattr(peer_tls, "RECHECK", 0.0)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(pki.ca.cert.read_bytes())
    tls = PeerTls(Settings(replication_ca_file=str(ca)))
    first = tls.context()
    assert tls.context() is first  # unchanged files: the same context
    replaced = tmp_path / "ca.new"
    replaced.write_bytes(pki.stranger.cert.read_bytes())
    replaced.replace(ca)
    second = tls.context()
    assert second is not first
    assert [c["subject"] for c in second.get_ca_certs()] == [((("commonName", "test other-ca"),),)]
    ca.write_text("not a certificate\n")
    assert tls.context() is second


# -- the settings, checked at start ------------------------------------------------------


def test_bad_files_are_refused_at_start_by_name(pki, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    missing = str(tmp_path / "missing.pem")
    client = {
        "replication_cert_file": str(pki.client.cert),
        "replication_key_file": str(pki.client.key),
    }
    cases: list[tuple[dict[str, str], str]] = [
        ({"replication_ca_file": missing}, "replication-ca-file .* cannot be read"),
        ({"replication_ca_file": str(empty)}, "replication-ca-file .* not a PEM certificate"),
        ({"replication_ca_file": str(junk)}, "replication-ca-file .* not a PEM certificate"),
        ({"replication_ca_file": str(pki.client.key)}, "replication-ca-file"),
        ({"replication_cert_file": str(pki.client.cert)}, "needs replication-key-file"),
        ({"replication_key_file": str(pki.client.key)}, "needs replication-cert-file"),
        ({**client, "replication_cert_file": missing}, "replication-cert-file .* cannot be read"),
        ({**client, "replication_cert_file": str(junk)}, "replication-cert-file"),
        ({**client, "replication_key_file": missing}, "replication-key-file .* cannot be read"),
        ({**client, "replication_key_file": str(pki.client.cert)}, "replication-key-file"),
        ({**client, "replication_key_file": str(pki.server.key)}, "does not go with"),
    ]
    for values, message in cases:
        with pytest.raises(ValueError, match=message):
            Settings(**values)


def test_an_encrypted_key_is_refused_without_asking_for_a_password(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client.key.read_bytes(), password=None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(ValueError, match=r"replication-key-file .* is encrypted"):
        Settings(replication_cert_file=str(pki.client.cert), replication_key_file=str(locked))


def test_good_files_are_taken_from_flags_and_variables(pki, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = parser.parse_args(["--replication-cert-file", str(pki.client.cert)])
    env = {
        "DS_REPLICATION_CA_FILE": str(pki.ca.cert),
        "DS_REPLICATION_KEY_FILE": str(pki.client.key),
    }
    s = settings_from(flags, env)
    assert (s.replication_ca_file, s.replication_cert_file, s.replication_key_file) == (
        str(pki.ca.cert),
        str(pki.client.cert),
        str(pki.client.key),
    )
    # The command line stops before serving, naming the setting.
    with pytest.raises(SystemExit) as stopped:
        cli.main(["serve", "--replication-ca-file", str(pki.client.key)])
    assert stopped.value.code == 2
    assert "replication-ca-file" in capsys.readouterr().err
