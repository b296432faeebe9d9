"""Certificate renewal and token revocation reach a running server (issue 15, finding 6).

Real server processes over real TLS. The certificate lives in a directory
laid out as the kubelet lays out a Secret volume (``tls.crt`` ->
``..data/tls.crt``, ``..data`` -> a timestamped directory, updated by
swapping ``..data``), so the mounted names never change themselves. A new
connection must get the renewed certificate (compared whole, DER against
DER; the serials differ); a renewal that does not load (a key that does not
match) keeps the previous certificate. A token removed from the token file
stops working; a token file that does not parse keeps the previous tokens;
SIGHUP reloads at once, whatever the interval.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from testkit import needs, wait_for

pytestmark = pytest.mark.processes

BIN = {"Content-Type": "application/octet-stream"}
INTERVAL = "0.2"  # seconds between checks of the files: the tests wait for the change


def make_cert(out: Path, serial: int) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 with its own key and the given serial."""
    out.mkdir(parents=True, exist_ok=True)
    cert, key = out / f"cert{serial}.pem", out / f"key{serial}.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-set_serial", str(serial), "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


class SecretVolume:
    """A directory as the kubelet writes a mounted Secret, updated as it updates one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.version = 0

    def write(self, files: dict[str, bytes]) -> None:
        self.version += 1
        new = self.root / f"..2026_11_23_12_00_0{self.version}"
        new.mkdir()
        for name, content in files.items():
            (new / name).write_bytes(content)
        data = self.root / "..data"
        old = data.resolve() if data.exists() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(new.name)
        os.replace(tmp, data)  # the one atomic step
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        if old is not None:
            shutil.rmtree(old)

    def path(self, name: str) -> str:
        return str(self.root / name)


def peer_cert(port: int) -> bytes:
    """The certificate a new TLS connection to 127.0.0.1:port is given (DER)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


@needs.commands("openssl", install="Debian's openssl (make system-deps)")
def test_a_renewed_certificate_is_served_to_new_connections(server_factory, tmp_path):
    certs = tmp_path / "certs"
    cert1, key1 = make_cert(certs, 1)
    cert2, key2 = make_cert(certs, 2)
    cert3, _ = make_cert(certs, 3)
    secret = SecretVolume(tmp_path / "tls")
    secret.write({"tls.crt": cert1.read_bytes(), "tls.key": key1.read_bytes()})
    srv = server_factory(
        "--tls-cert",
        secret.path("tls.crt"),
        "--tls-key",
        secret.path("tls.key"),
        "--reload-interval",
        INTERVAL,
    )
    srv.scheme = "https"
    srv.start()
    assert peer_cert(srv.port) == der(cert1)
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert1))) as old:
        assert old.put(f"{srv.base}tls", headers=BIN, content=b"a").status_code == 201

        secret.write({"tls.crt": cert2.read_bytes(), "tls.key": key2.read_bytes()})  # renewal
        wait_for(lambda: peer_cert(srv.port) == der(cert2), message="the renewed certificate")
        # The connection opened before keeps the certificate it negotiated.
        assert old.post(f"{srv.base}tls", headers=BIN, content=b"b").status_code == 204
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert2))) as new:
        assert new.get(f"{srv.base}tls", params={"offset": "-1"}).content == b"ab"

    # A renewal whose key does not match its certificate: logged, cert2 stays.
    secret.write({"tls.crt": cert3.read_bytes(), "tls.key": key2.read_bytes()})
    wait_for(lambda: "TLS certificate changed but does not load" in srv.log(), message="refusal")
    assert peer_cert(srv.port) == der(cert2)
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert2))) as c:
        assert c.head(f"{srv.base}tls").status_code == 200


def tokens(*names: str) -> bytes:
    return json.dumps(
        {"tokens": [{"name": n, "token": f"secret-{n}", "scopes": ["admin"]} for n in names]}
    ).encode()


def status(srv, token: str) -> int:
    headers = {"Authorization": f"Bearer secret-{token}"}
    return httpx.head(f"{srv.base}t", headers=headers, timeout=10).status_code


def test_a_revoked_token_stops_working(server_factory, tmp_path):
    secret = SecretVolume(tmp_path / "auth")
    secret.write({"tokens.json": tokens("ops", "ci")})
    srv = server_factory(
        "--auth-tokens-file", secret.path("tokens.json"), "--reload-interval", INTERVAL
    ).start()
    headers = {"Authorization": "Bearer secret-ops", **BIN}
    assert httpx.put(f"{srv.base}t", headers=headers).status_code == 201
    assert status(srv, "ci") == 200

    secret.write({"tokens.json": tokens("ops")})  # ci revoked
    wait_for(lambda: status(srv, "ci") == 401, message="the revoked token refused")
    assert status(srv, "ops") == 200

    secret.write({"tokens.json": b'{"tokens": ['})  # a broken edit: the tokens in use stay
    wait_for(lambda: "token file changed but does not load" in srv.log(), message="refusal")
    assert status(srv, "ops") == 200 and status(srv, "ci") == 401
    assert "secret-" not in srv.log()  # no token is ever logged


def test_sighup_reloads_the_token_file_at_once(server_factory, tmp_path):
    path = tmp_path / "tokens.json"
    path.write_bytes(tokens("ops", "ci"))
    srv = server_factory("--auth-tokens-file", str(path), "--reload-interval", "3600").start()
    assert status(srv, "ci") == 404  # allowed: the stream does not exist
    path.write_bytes(tokens("ops"))  # rewritten in place, no symlink
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: status(srv, "ci") == 401, message="reload on SIGHUP")
    assert status(srv, "ops") == 404
    assert srv.proc.poll() is None  # SIGHUP does not stop the server
