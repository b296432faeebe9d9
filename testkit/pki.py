"""A private CA and the certificates it signs, as PEM files, for tests over TLS.

cert-manager's CA issuer in miniature: one self-signed CA, server
certificates for host names or IP addresses (subjectAltName), and client
certificates (extended key usage clientAuth). EC P-256 keys: quick to make.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class PrivateCA:
    """A CA whose certificate is ``<dir>/<name>.crt``; it issues into the same directory."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.subject = _name(f"test {name}")
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(self.subject)
            .issuer_name(self.subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY)
            .not_valid_after(now + DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert = self.dir / f"{name}.crt"
        self.cert.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, *hosts: str, client: bool = False, server_and_client: bool = False
    ) -> Issued:
        """A certificate ``<name>.crt`` and key ``<name>.key``: for a server reached at
        ``hosts`` (DNS names or IP addresses), or with ``client`` a client certificate;
        ``server_and_client``: both usages (a replica's, which it serves and presents)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
        if server_and_client:
            usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(hosts[0] if hosts else name))
            .issuer_name(self.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY)
            .not_valid_after(now + DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False
            )
        certificate = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        issued.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(key, issued.key)
        return issued


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
