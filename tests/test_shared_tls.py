"""The test process's httpx clients share one verifying TLS context (testkit/shared_tls.py)
and still verify; any other TLS setting gets a context of its own."""

from __future__ import annotations

import ssl

import httpx


def _context(client: httpx.Client) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined,no-any-return]


def test_default_clients_share_one_context_that_verifies():
    with httpx.Client() as a, httpx.Client() as b:
        assert _context(a) is _context(b)
        assert _context(a).verify_mode == ssl.CERT_REQUIRED and _context(a).check_hostname


def test_a_client_with_tls_settings_of_its_own_gets_its_own_context():
    with httpx.Client() as shared, httpx.Client(verify=False) as unverified:
        assert _context(unverified) is not _context(shared)
        assert _context(unverified).verify_mode == ssl.CERT_NONE
    mine = ssl.create_default_context()
    with httpx.Client(verify=mine) as given, httpx.Client(trust_env=False) as untrusting:
        assert _context(given) is mine
        assert _context(untrusting) is not _context(httpx.Client())
