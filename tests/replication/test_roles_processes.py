"""Two real servers sharing one Lease on the emulated API server: one primary,
one standby that refuses writes and names the primary, and a primary that
refuses to acknowledge alone when the set requires more replicas in sync."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from testkit.cluster import Cluster, cluster

FAST = ["--lease-duration", "3", "--lease-renew-deadline", "2", "--lease-retry-period", "0.3"]


@pytest.fixture(scope="module")
def api() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def start_set(server_factory, api: Cluster, lease: str, *extra: str, count: int = 2) -> list:
    servers = []
    for i in range(count):
        srv = server_factory()
        srv.args += [
            "--replication-lease", f"default/{lease}",
            "--replica-name", f"r{i}",
            "--replica-url", srv.url,
            "--kube-api", api.url,
            "--replication-set-size", "2",
            "--replication-wait", "0.5",
            *FAST,
            *extra,
        ]  # fmt: skip
        servers.append(srv.start())
    return servers


def roles(servers: list) -> list[dict]:
    """Each server's /replication, once one of them is primary and all agree on it."""
    deadline = time.monotonic() + 30
    while True:
        status = [httpx.get(f"{s.url}/replication").json() for s in servers]
        primaries = [s for s in status if s["role"] == "primary"]
        if (
            len(primaries) == 1
            and primaries[0]["primary"]
            and all(s["primary"] == primaries[0]["primary"] for s in status)
        ):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def test_the_standby_refuses_writes_and_names_the_primary(server_factory, api) -> None:
    servers = start_set(server_factory, api, "names", "--min-in-sync", "1")
    status = roles(servers)
    primary = next(s for s, st in zip(servers, status, strict=True) if st["role"] == "primary")
    standby = next(s for s, st in zip(servers, status, strict=True) if st["role"] == "standby")
    assert {st["term"] for st in status} == {1}
    assert status[0]["durability"] == "required"
    r = httpx.put(f"{standby.base}s", headers={"content-type": "text/plain"})
    assert r.status_code == 503
    assert r.headers["stream-primary"] == primary.url
    assert r.headers["retry-after"] == "1"
    assert httpx.head(f"{standby.base}s").status_code == 404  # nothing was applied there
    r = httpx.put(f"{primary.base}s", headers={"content-type": "text/plain"})
    assert r.status_code == 201
    assert (
        httpx.post(
            f"{primary.base}s", content=b"x", headers={"content-type": "text/plain"}
        ).status_code
        == 204
    )


def test_too_few_in_sync_is_a_503_not_an_acknowledgement(server_factory, api) -> None:
    servers = start_set(server_factory, api, "quorum", count=1)  # min-in-sync 0: 2 of 2
    status = roles(servers)
    primary = next(s for s, st in zip(servers, status, strict=True) if st["role"] == "primary")
    assert next(st for st in status if st["role"] == "primary")["degraded"] is True
    r = httpx.put(f"{primary.base}q", headers={"content-type": "text/plain"})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert "too few replicas in sync" in r.text
    assert httpx.head(f"{primary.base}q").status_code == 404


def test_preferred_durability_writes_alone_and_says_so(server_factory, api) -> None:
    servers = start_set(
        server_factory, api, "preferred", "--replication-durability", "preferred", count=1
    )
    status = roles(servers)
    primary = next(s for s, st in zip(servers, status, strict=True) if st["role"] == "primary")
    assert next(st for st in status if st["role"] == "primary")["degraded"] is True
    r = httpx.put(f"{primary.base}p", headers={"content-type": "text/plain"})
    assert r.status_code == 201


def test_single_node_mode_has_no_replication_endpoint(server_factory) -> None:
    srv = server_factory().start()
    assert httpx.get(f"{srv.url}/replication").status_code == 404
    assert httpx.put(f"{srv.base}s", headers={"content-type": "text/plain"}).status_code == 201
