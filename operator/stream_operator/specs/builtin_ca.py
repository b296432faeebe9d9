"""The operator's own CA per DurableStream, when no certificate is given.

Without ``certificates.issuerRef`` and ``server.tlsSecretName`` a replica set still
serves TLS: replication traffic and the peer token would otherwise cross the pod
network in clear text. As CloudNativePG does, the operator keeps a CA per
DurableStream in a Secret (``<name>-ca``) and signs the servers' certificate with it
into ``<name>-tls``, which every place that serves or checks TLS already follows
(``certificates.with_certificate``).

Rotation never leaves a window in which one pod distrusts another: the kubelet
updates each pod's copy of a Secret at its own moment, so the trust bundle
(``ca.crt``) always grows before a certificate changes issuer, and shrinks only after:

1. the CA is past two thirds of its life: a new CA is *staged* (``next.crt``) and
   added to the bundle, the certificate served is unchanged;
2. ``PROPAGATION`` later the new CA is *promoted*; the certificate is reissued by it
   and the old CA stays in the bundle (``previous.crt``);
3. ``PROPAGATION`` later the old CA leaves the bundle.

The server's certificate is reissued at two thirds of its life, when its names change,
or when its issuer is not the current CA; the servers reload it from the mounted
files without a restart (stream_server/rotation.py), so no pod rolls.

Pure functions of the Secrets' decoded data and the time; builtin_tls.py writes them.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFE = datetime.timedelta(days=365)
CERT_LIFE = datetime.timedelta(days=90)
# Long enough for every kubelet to have updated its copy of a Secret (its sync period
# and cache TTL are about a minute each by default).
PROPAGATION = datetime.timedelta(minutes=10)
# Clocks of the pods that check a certificate may be a little behind the operator's.
BACKDATE = datetime.timedelta(minutes=5)

# The CA Secret's keys, and the TLS Secret's (kubernetes.io/tls, as cert-manager's).
CA_CERT, CA_KEY = "ca.crt", "ca.key"
NEXT_CERT, NEXT_KEY, STAGED_AT = "next.crt", "next.key", "staged-at"
PREVIOUS_CERT, PROMOTED_AT = "previous.crt", "promoted-at"
TLS_CERT, TLS_KEY, TLS_CA = "tls.crt", "tls.key", "ca.crt"

Data = dict[str, str]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(common_name: str, now: datetime.datetime) -> tuple[str, str]:
    """A new self-signed CA (certificate PEM, key PEM), path length 0."""
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_LIFE)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _pem(cert), _pem_key(key)


def _san(name: str) -> x509.GeneralName:
    """A DNS name, or an IP address SAN for an address (tests reach servers by one)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue(
    ca_cert_pem: str, ca_key_pem: str, dns_names: Sequence[str], now: datetime.datetime
) -> tuple[str, str]:
    """A server certificate for ``dns_names`` signed by the CA (certificate, key PEM):
    server and client auth, since a standby presents it to its primary too."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key this operator made")
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + CERT_LIFE, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in dns_names]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _pem(cert), _pem_key(key)


def _cert(pem: str | None) -> x509.Certificate | None:
    if not pem:
        return None
    try:
        return x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        return None


def past_renewal(pem: str, now: datetime.datetime) -> bool:
    """Whether the certificate is past two thirds of its life (or unreadable)."""
    cert = _cert(pem)
    if cert is None:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * 2 / 3


def _signed_by(cert: x509.Certificate, ca_pem: str) -> bool:
    ca = _cert(ca_pem)
    if ca is None or cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    addresses = [str(a) for a in san.value.get_values_for_type(x509.IPAddress)]
    return list(san.value.get_values_for_type(x509.DNSName)) + addresses


def _stamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).isoformat()


def _elapsed(data: Mapping[str, str], key: str, now: datetime.datetime) -> bool:
    """Whether ``PROPAGATION`` has passed since the time stored at ``key``."""
    try:
        since = datetime.datetime.fromisoformat(data[key])
    except (KeyError, ValueError):
        return True
    return now - since >= PROPAGATION


@dataclass(frozen=True)
class Wanted:
    """What the two Secrets must become (None: leave that one as it is)."""

    ca: Data | None
    tls: Data | None
    why: str = ""


def bundle(ca: Mapping[str, str]) -> str:
    """Every CA a peer may present a certificate from: current, staged and previous."""
    return "".join(ca[k] for k in (CA_CERT, NEXT_CERT, PREVIOUS_CERT) if ca.get(k))


def step(
    common_name: str,
    ca: Mapping[str, str] | None,
    tls: Mapping[str, str] | None,
    dns_names: Sequence[str],
    now: datetime.datetime,
) -> Wanted:
    """The next change to the CA Secret ``ca`` and TLS Secret ``tls`` (their decoded
    data; None: absent). One step at a time: called again at every reconcile."""
    why = ""
    if ca is None or _cert(ca.get(CA_CERT)) is None or not ca.get(CA_KEY):
        cert, key = make_ca(common_name, now)
        new_ca: Data = {CA_CERT: cert, CA_KEY: key}
        why = "made the CA"
    else:
        new_ca = dict(ca)
        if new_ca.get(PREVIOUS_CERT) and _elapsed(new_ca, PROMOTED_AT, now):
            new_ca.pop(PREVIOUS_CERT)
            new_ca.pop(PROMOTED_AT, None)
            why = "the old CA left the trust bundle"
        elif new_ca.get(NEXT_CERT) and _elapsed(new_ca, STAGED_AT, now):
            new_ca[PREVIOUS_CERT] = new_ca[CA_CERT]
            new_ca[CA_CERT], new_ca[CA_KEY] = new_ca.pop(NEXT_CERT), new_ca.pop(NEXT_KEY)
            new_ca.pop(STAGED_AT, None)
            new_ca[PROMOTED_AT] = _stamp(now)
            why = "the new CA is in use"
        elif (
            not new_ca.get(NEXT_CERT)
            and not new_ca.get(PREVIOUS_CERT)
            and past_renewal(new_ca[CA_CERT], now)
        ):
            new_ca[NEXT_CERT], new_ca[NEXT_KEY] = make_ca(common_name, now)
            new_ca[STAGED_AT] = _stamp(now)
            why = "a new CA is trusted before it is used"
    served = _cert((tls or {}).get(TLS_CERT))
    reissue = (
        served is None
        or not (tls or {}).get(TLS_KEY)
        or not _signed_by(served, new_ca[CA_CERT])
        or sorted(_names(served)) != sorted(dns_names)
        or past_renewal((tls or {})[TLS_CERT], now)
    )
    new_tls: Data = dict(tls or {})
    if reissue:
        new_tls[TLS_CERT], new_tls[TLS_KEY] = issue(new_ca[CA_CERT], new_ca[CA_KEY], dns_names, now)
        why = why or "reissued the server certificate"
    new_tls[TLS_CA] = bundle(new_ca)
    return Wanted(
        ca=None if new_ca == dict(ca or {}) else new_ca,
        tls=None if new_tls == dict(tls or {}) else new_tls,
        why=why or "the trust bundle changed",
    )
