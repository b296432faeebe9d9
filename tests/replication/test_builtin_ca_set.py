"""Issue 42: a replica set replicates over TLS with the operator's built-in CA: the
certificate and trust bundle builtin_ca.step makes (the contents of the ``<name>-tls``
Secret) given to real server processes exactly as the operator mounts them (the
certificate and key served and presented, ``ca.crt`` as the replication CA file)."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import httpx
import pytest

from stream_operator.specs import builtin_ca
from stream_operator.specs.certificates import dns_names
from testkit.replica_set_processes import until
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.processes

TEXT = {"Content-Type": "text/plain"}


def in_sync_primary(c: httpx.Client, servers: list[ServerProcess]) -> ServerProcess | None:
    for srv in servers:
        try:
            st = c.get(f"{srv.url}/replication").json()
        except httpx.HTTPError:
            continue
        if st["role"] == "primary" and len(st["in_sync"]) == 2:
            return srv
    return None


def test_a_set_replicates_over_the_builtin_cas_certificate(start_set, tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    # The pods' names, and the address the test's servers answer at.
    names = [*dns_names("events", "default", 3), "127.0.0.1"]
    wanted = builtin_ca.step("default/events CA", None, None, names, now)
    assert wanted.tls is not None
    files = {}
    for key in (builtin_ca.TLS_CERT, builtin_ca.TLS_KEY, builtin_ca.TLS_CA):
        files[key] = tmp_path / key
        files[key].write_text(wanted.tls[key])
    tls = [
        "--tls-cert", str(files["tls.crt"]), "--tls-key", str(files["tls.key"]),
        "--replication-ca-file", str(files["ca.crt"]),
    ]  # fmt: skip
    servers = start_set("builtin-ca", *tls, scheme="https")
    trust = ssl.create_default_context(cafile=str(files["ca.crt"]))
    with httpx.Client(verify=trust, timeout=30) as c:
        primary = until("a primary with both standbys in sync", lambda: in_sync_primary(c, servers))
        assert isinstance(primary, ServerProcess)
        url = f"{primary.base}over-builtin-tls"
        assert c.put(url, headers=TEXT).status_code == 201
        assert c.post(url, content=b"x;", headers=TEXT).status_code == 204
        st = c.get(f"{primary.url}/replication").json()
        assert len(st["in_sync"]) == 2, st
