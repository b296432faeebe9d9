"""Two real servers sharing one Lease on the emulated API server: one primary,
one standby that refuses writes and names the primary, and a primary that
refuses to acknowledge alone when the set requires more replicas in sync."""

from __future__ import annotations

import httpx
import pytest

from testkit import wait_for

pytestmark = pytest.mark.processes

# Every set here counts two replicas; a test may start only one of them.
ROLE_ARGS = ("--replication-wait", "0.5")


def roles(servers: list) -> list[dict]:
    """Each server's /replication, once one of them is primary and all agree on it."""
    last: list[dict] = []

    def agreed() -> list[dict] | None:
        last[:] = [httpx.get(f"{s.url}/replication").json() for s in servers]
        primaries = [s for s in last if s["role"] == "primary"]
        if (
            len(primaries) == 1
            and primaries[0]["primary"]
            and all(s["primary"] == primaries[0]["primary"] for s in last)
        ):
            return list(last)
        return None

    return wait_for(agreed, timeout=30, message=lambda: f"one agreed primary: {last}")


def test_the_standby_refuses_writes_and_names_the_primary(start_set) -> None:
    servers = start_set("names", *ROLE_ARGS, "--min-in-sync", "1", count=2, set_size=2)
    status = roles(servers)
    primary = next(s for s, st in zip(servers, status, strict=True) if st["role"] == "primary")
    standby = next(s for s, st in zip(servers, status, strict=True) if st["role"] == "standby")
    assert {st["term"] for st in status} == {1}
    assert status[0]["durability"] == "required"
    r = httpx.put(f"{standby.base}s", headers={"content-type": "text/plain"})
    assert r.status_code == 503
    assert r.headers["stream-primary"] == primary.url
    assert r.headers["retry-after"] == "1"
    # Nothing was applied there (asked once it is current: until then it refuses reads).
    wait_for(
        lambda: httpx.get(f"{standby.url}/replication").json()["fresh_for"] > 0,
        timeout=30,
        message="the standby current",
    )
    assert httpx.head(f"{standby.base}s").status_code == 404
    r = httpx.put(f"{primary.base}s", headers={"content-type": "text/plain"})
    assert r.status_code == 201
    assert (
        httpx.post(
            f"{primary.base}s", content=b"x", headers={"content-type": "text/plain"}
        ).status_code
        == 204
    )


def test_too_few_in_sync_is_a_503_not_an_acknowledgement(start_set) -> None:
    servers = start_set("quorum", *ROLE_ARGS, count=1, set_size=2)  # min-in-sync 0: 2 of 2
    status = roles(servers)
    primary = next(s for s, st in zip(servers, status, strict=True) if st["role"] == "primary")
    assert next(st for st in status if st["role"] == "primary")["degraded"] is True
    r = httpx.put(f"{primary.base}q", headers={"content-type": "text/plain"})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert "too few replicas in sync" in r.text
    assert httpx.head(f"{primary.base}q").status_code == 404


def test_preferred_durability_writes_alone_and_says_so(start_set) -> None:
    servers = start_set(
        "preferred", *ROLE_ARGS, "--replication-durability", "preferred", count=1, set_size=2
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
