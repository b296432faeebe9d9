"""Replica sets of real server processes sharing a Lease on the emulated API server: the
fixtures (one API server per module, a Lease per test, ``start_set``). The timings,
waits and status reads the tests share are in ``testkit.replica_set_processes``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.cluster import Cluster, cluster
from testkit.replica_set_processes import STEADY, StartSet, start_member
from testkit.server_process import ServerProcess


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
