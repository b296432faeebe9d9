"""TLS to the other replicas: one client context for every connection to a peer.

With https replica URLs a standby's stream, and its snapshot
download (a re-copy), check the primary's certificate. A set's certificates
usually come from a private CA (cert-manager's CA issuer; a public CA cannot
name ``pod.name-headless.namespace.svc``), which the system store does not
hold: every handshake then failed with CERTIFICATE_VERIFY_FAILED and no
standby could join. ``--replication-ca-file`` names a PEM bundle of CAs that
peer certificates are checked against *instead of* the system store (a
private CA is the point; mixing in every public CA would let any publicly
issued certificate for a peer's name pass). Host names and IP addresses are
checked as for any https client. ``--replication-cert-file`` and
``--replication-key-file`` give a client certificate this replica presents
to its peers, for a mesh or proxy between them that requires mutual TLS; the
server itself does not ask clients for certificates (docs/replication.md,
"TLS between replicas").

Every file is loaded at start, where a missing or unreadable file, a bundle
without a certificate, an encrypted or malformed key, or a key that does not
match its certificate stops the server with the setting's name. They are
read again when they change (cert-manager renews the client certificate
into its Secret), as the peer token file is: looked at at most once a
``RECHECK`` seconds when a connection is opened; a change that does not load
keeps the context in use and is logged. Connections already open keep the
context they were made with.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from stream_server.declared.groups import ReplicationSettings
from stream_server.rotation import Reloaded

log = logging.getLogger("stream_server.replication")

RECHECK = 1.0  # seconds between two looks at the files' signature


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _read(setting: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{_flag(setting)} {path!r} cannot be read: {exc}") from None


def _certificates(setting: str, path: str) -> None:
    """ValueError naming ``setting`` unless ``path`` holds PEM certificates only."""
    data = _read(setting, path)
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"{_flag(setting)} {path!r} is not a PEM certificate: {exc}") from None


def _key(path: str) -> None:
    setting = "replication_key_file"
    data = _read(setting, path)
    try:
        serialization.load_pem_private_key(data, password=None)
    except TypeError:  # cryptography's word for "encrypted, and no password given"
        raise ValueError(
            f"{_flag(setting)} {path!r} is encrypted; give the key unencrypted"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"{_flag(setting)} {path!r} is not a PEM private key: {exc}") from None


def _no_password() -> bytes:
    raise ValueError("replication-key-file is encrypted; give the key unencrypted")


def check(s: ReplicationSettings) -> None:
    """ValueError naming the setting that is wrong (called at start, with the others)."""
    if bool(s.replication_cert_file) != bool(s.replication_key_file):
        given, missing = (
            ("replication-cert-file", "replication-key-file")
            if s.replication_cert_file
            else ("replication-key-file", "replication-cert-file")
        )
        raise ValueError(f"{given} needs {missing} too (a client certificate and its key)")
    if s.replication_ca_file or s.replication_cert_file:
        build(s)


def build(s: ReplicationSettings) -> ssl.SSLContext:
    """The client context for peers, from the settings' files; ValueError naming the
    setting whose file does not load."""
    if s.replication_ca_file:
        _certificates("replication_ca_file", s.replication_ca_file)
    # With a CA file, that file alone (the system's CAs are not loaded); else the system's.
    context = ssl.create_default_context(cafile=s.replication_ca_file or None)
    if s.replication_cert_file:
        _certificates("replication_cert_file", s.replication_cert_file)
        _key(s.replication_key_file)
        try:
            context.load_cert_chain(
                s.replication_cert_file, s.replication_key_file, password=_no_password
            )
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"replication-key-file {s.replication_key_file!r} does not go with "
                f"replication-cert-file {s.replication_cert_file!r}: {exc}"
            ) from None
    return context


class PeerTls:
    """The peers' client context, built again when its files change."""

    def __init__(self, s: ReplicationSettings) -> None:
        self.settings = s
        paths = (s.replication_ca_file, s.replication_cert_file, s.replication_key_file)
        self._context = Reloaded(
            "the peers' TLS files", [p for p in paths if p], lambda: build(s), RECHECK
        )

    def context(self) -> ssl.SSLContext:
        """The context for a new connection to a peer."""
        return self._context.get()
