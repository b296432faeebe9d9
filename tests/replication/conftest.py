"""Replica sets of real server processes sharing a Lease on the emulated API server,
and the waits the tests on them share (imported as ``tests.replication.conftest``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conftest import ServerProcess
from testkit import wait_for
from testkit.cluster import Cluster, cluster

# Short leases, for the tests that kill or pause a primary: a failover happens within
# a test's patience. A long wait for the standbys, so that a loaded machine (2 cores,
# the whole suite on two workers) does not turn slow replication into refusals.
FAST = [
    "--lease-duration", "3", "--lease-renew-deadline", "2", "--lease-retry-period", "0.3",
    "--replication-wait", "10",
]  # fmt: skip
# Leases for the tests where the primary is meant to stay: a renewal held up for 2 s
# by that load (CI saw one) would make a primary step down in the middle of a test
# about something else. A restarted primary takes its own Lease back at once, so
# only a failover waits for these durations.
STEADY = [
    "--lease-duration", "15", "--lease-renew-deadline", "10", "--lease-retry-period", "0.3",
    "--replication-wait", "10",
]  # fmt: skip

StartSet = Callable[..., list[ServerProcess]]


@pytest.fixture(scope="module")
def api() -> Iterator[Cluster]:
    """One emulated API server per test module; tests keep apart by their Lease names."""
    with cluster() as c:
        yield c


@pytest.fixture
def lease(api: Cluster, request: pytest.FixtureRequest) -> str:
    """A Lease name of the test's own, so tests share one API server."""
    name = request.node.name.replace("_", "-").lower()[:50]
    return f"default/{name}"


@pytest.fixture
def start_set(server_factory, api: Cluster) -> StartSet:
    """Start ``count`` servers named r0, r1, ... holding the Lease ``default/<lease>``, in a
    set of ``set_size`` replicas (default: ``count``, fewer when a test wants a set short of
    its members); ``extra`` arguments go to every server. ``timings`` is ``STEADY`` unless
    the test kills a primary and waits for the next (``FAST``). ``scheme="https"`` for
    servers that serve TLS (``extra`` then names ``--tls-cert`` and ``--tls-key``): their
    replica URLs are https."""

    def start(
        lease: str,
        *extra: str,
        count: int = 3,
        set_size: int | None = None,
        timings: list[str] = STEADY,
        scheme: str = "http",
    ) -> list[ServerProcess]:
        return [
            start_member(
                server_factory, api, lease, f"r{i}", set_size=set_size or count,
                timings=[*timings, *extra], scheme=scheme,
            )
            for i in range(count)
        ]  # fmt: skip

    return start


def start_member(
    server_factory,
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
    srv = server_factory(data_dir=data_dir, env=env)
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


def status(srv: ServerProcess) -> dict:
    return httpx.get(f"{srv.url}/replication", timeout=5).json()


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
