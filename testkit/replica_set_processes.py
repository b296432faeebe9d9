"""Replica sets of real server processes sharing a Lease on the emulated API server: the
lease timings they run with, starting one member, a member's replication status, and
the waits the tests on them share.

Used by tests/replication/ (its conftest.py's ``start_set`` fixture starts sets with
``start_member``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from testkit import wait_for
from testkit.cluster import Cluster
from testkit.server_process import ServerProcess


def leases(duration: int, renew_deadline: int) -> list[str]:
    """A member's Lease timings (retried every 0.3 s), with a long wait for the standbys,
    so that a loaded machine (2 cores, the whole suite on two workers) does not turn
    slow replication into refusals."""
    return [
        "--lease-duration", str(duration), "--lease-renew-deadline", str(renew_deadline),
        "--lease-retry-period", "0.3", "--replication-wait", "10",
    ]  # fmt: skip


# Short leases, for the tests that kill or pause a primary: a failover happens within
# a test's patience.
FAST = leases(3, 2)
# Leases for the tests where the primary is meant to stay: a renewal held up for 2 s
# by that load (CI saw one) would make a primary step down in the middle of a test
# about something else. A restarted primary takes its own Lease back at once, so
# only a failover waits for these durations.
STEADY = leases(15, 10)
# Leases for the tests that stop the whole set and start it again: the Lease the
# stopped primary held is waited out in seconds, and a renewal has 4 s, twice FAST's.
RESTARTED = leases(6, 4)
# Leases for a test that writes through a primary, then kills it and waits for the next:
# a renewal has 4 s (with FAST's 2 s, a renewal late on a loaded machine made the primary
# step down in the middle of the writes, and at a load of 14 the set changed hands for
# minutes), and the killed primary's Lease is waited out in 6 s.
FAILOVER = leases(6, 4)

StartSet = Callable[..., list[ServerProcess]]


def start_member(
    server_factory: Callable[..., ServerProcess],
    api: Cluster,
    lease: str,
    name: str,
    *,
    set_size: int = 3,
    timings: list[str] = STEADY,
    data_dir: Path | None = None,
    env: dict[str, str] | None = None,
    scheme: str = "http",
) -> ServerProcess:
    """One server of the set holding the Lease ``default/<lease>`` (on ``data_dir``, a
    new one by default), started; ``timings`` and any further arguments after them."""
    srv: ServerProcess = server_factory(data_dir=data_dir, env=env)
    srv.scheme = scheme
    srv.args += [
        "--replication-lease", f"default/{lease}",
        "--replica-name", name,
        "--replica-url", srv.url,
        "--kube-api", api.url,
        "--replication-set-size", str(set_size),
        *timings,
    ]  # fmt: skip
    return srv.start()


def status(srv: ServerProcess) -> dict[str, Any]:
    """A member's ``/replication`` report (its role, the standbys in sync, ...)."""
    report: dict[str, Any] = httpx.get(f"{srv.url}/replication", timeout=5).json()
    return report


def until(what: str, check: Callable[[], object], timeout: float = 60.0) -> object:
    """``wait_for``, with a server that refuses or drops the connection taken as "not
    yet": in a replica set a server restarts by itself (a re-copy execs it anew), and
    one killed by the test comes back. The last such error is in the timeout's message."""
    last: list[httpx.TransportError] = []

    def attempt() -> object:
        try:
            return check()
        except httpx.TransportError as exc:
            last[:] = [exc]
            return None

    return wait_for(
        attempt, timeout=timeout, message=lambda: what + (f" (last: {last[0]!r})" if last else "")
    )


def primary_with_standbys(servers: list[ServerProcess], in_sync: int) -> ServerProcess:
    """The server that is primary with at least ``in_sync`` standbys in sync, once one is."""

    def check() -> ServerProcess | None:
        for srv in servers:
            try:
                st = status(srv)
            except httpx.HTTPError:
                continue
            if st["role"] == "primary" and len(st["in_sync"]) >= in_sync:
                return srv
        return None

    return wait_for(check, timeout=60.0, message=f"a primary with {in_sync} in sync")
