"""Issue 42: the operator's built-in CA (builtin_ca.py) with real certificates.

Each check is a TLS handshake between two in-memory ``ssl`` endpoints: a peer holding
one version of the Secret's ``ca.crt`` connects, by a pod's name, to a server holding
another's ``tls.crt``/``tls.key``. A rotation must never produce a pair of versions that
refuse each other (the kubelet updates each pod's copy at its own moment).
"""

from __future__ import annotations

import datetime
import itertools
import ssl
import tempfile
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509 import DNSName
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from stream_operator.specs import builtin_ca as ca
from stream_operator.specs.certificates import dns_names

NOW = datetime.datetime.now(datetime.UTC)
NAMES = dns_names("events", "ns", 3)
POD = "events-1.events-headless.ns.svc"


def handshake(trust: str, served: dict[str, str], host: str = POD) -> None:
    """A real TLS handshake now; raises ssl.SSLError when the peer refuses the certificate."""
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d, "tls.crt"), Path(d, "tls.key")
        cert.write_text(served[ca.TLS_CERT])
        key.write_text(served[ca.TLS_KEY])
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(cadata=trust)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=host)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, obj, out, peer_in in (
            ("client", client, c_out, s_in),
            ("server", server, s_out, c_in),
        ):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


def verify(trust: str, served: dict[str, str], at: datetime.datetime, host: str = POD) -> None:
    """The path validation a peer makes at time ``at`` (the rotation's steps lie in the
    future): raises VerificationError when it refuses the certificate."""
    store = Store(x509.load_pem_x509_certificates(trust.encode()))
    verifier = PolicyBuilder().store(store).time(at).build_server_verifier(DNSName(host))
    verifier.verify(x509.load_pem_x509_certificate(served[ca.TLS_CERT].encode()), [])


def start() -> tuple[dict[str, str], dict[str, str]]:
    first = ca.step("ns/events CA", None, None, NAMES, NOW)
    assert first.ca is not None and first.tls is not None
    return first.ca, first.tls


def test_a_new_set_gets_a_ca_and_a_certificate_for_every_name() -> None:
    ca_data, tls = start()
    for host in (POD, "events.ns.svc", "events-replicas.ns", "events-0.events-headless.ns.svc"):
        handshake(tls[ca.TLS_CA], tls, host)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls[ca.TLS_CA], tls, "elsewhere.ns.svc")
    cert = x509.load_pem_x509_certificate(tls[ca.TLS_CERT].encode())
    assert cert.not_valid_after_utc - NOW <= ca.CERT_LIFE
    assert ca.CA_KEY not in tls  # the CA's key stays in its own Secret
    # Nothing changes on the next round.
    again = ca.step("ns/events CA", ca_data, tls, NAMES, NOW)
    assert (again.ca, again.tls) == (None, None)


def test_the_certificate_is_renewed_at_two_thirds_of_its_life_by_the_same_ca() -> None:
    ca_data, tls = start()
    early = NOW + ca.CERT_LIFE / 2
    assert ca.step("x", ca_data, tls, NAMES, early).tls is None
    later = ca.step("x", ca_data, tls, NAMES, NOW + ca.CERT_LIFE * 0.7)
    assert later.ca is None and later.tls is not None
    assert later.tls[ca.TLS_CERT] != tls[ca.TLS_CERT]
    # Peers that still hold the old Secret trust the new certificate, and the reverse.
    at = NOW + ca.CERT_LIFE * 0.7
    verify(tls[ca.TLS_CA], later.tls, at)
    verify(later.tls[ca.TLS_CA], tls, at)


def test_new_names_reissue_the_certificate() -> None:
    ca_data, tls = start()
    grown = ca.step("x", ca_data, tls, dns_names("events", "ns", 5), NOW)
    assert grown.tls is not None
    handshake(grown.tls[ca.TLS_CA], grown.tls, "events-4.events-headless.ns.svc")


def test_a_certificate_from_another_issuer_is_replaced() -> None:
    ca_data, _ = start()
    _, other = start()
    replaced = ca.step("x", ca_data, other, NAMES, NOW)
    assert replaced.tls is not None
    handshake(ca_data[ca.CA_CERT], replaced.tls)


def test_the_ca_rotates_without_two_versions_that_refuse_each_other() -> None:
    ca_data, tls = start()
    at = NOW + ca.CA_LIFE * 0.7
    staged = ca.step("x", ca_data, tls, NAMES, at)
    assert staged.ca is not None and staged.tls is not None
    assert ca.NEXT_CERT in staged.ca
    # Trusted before it is used: still served from the old CA (renewed: 90 days are past).
    verify(ca_data[ca.CA_CERT], staged.tls, at)
    versions = [staged.tls]
    # Not before every kubelet can have the new trust bundle.
    assert ca.step("x", staged.ca, staged.tls, NAMES, at + ca.PROPAGATION / 2).ca is None
    at += ca.PROPAGATION
    promoted = ca.step("x", staged.ca, staged.tls, NAMES, at)
    assert promoted.ca is not None and promoted.tls is not None
    assert promoted.ca[ca.PREVIOUS_CERT] == ca_data[ca.CA_CERT]
    assert promoted.ca[ca.CA_CERT] == staged.ca[ca.NEXT_CERT]
    versions.append(promoted.tls)
    at += ca.PROPAGATION
    done = ca.step("x", promoted.ca, promoted.tls, NAMES, at)
    assert done.ca is not None and done.tls is not None
    assert ca.PREVIOUS_CERT not in done.ca and ca.NEXT_CERT not in done.ca
    assert done.tls[ca.TLS_CERT] == promoted.tls[ca.TLS_CERT]
    versions.append(done.tls)
    # Neighbouring versions (a pod updated, its peer not yet) accept each other.
    for older, newer in itertools.pairwise(versions):
        verify(older[ca.TLS_CA], newer, at)
        verify(newer[ca.TLS_CA], older, at)
    # And the first CA is gone for good at the end.
    with pytest.raises(VerificationError):
        verify(done.tls[ca.TLS_CA], staged.tls, at)
