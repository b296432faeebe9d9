"""Role loops on the emulated API server with a clock the test moves: the pieces the
role-loop tests share (a replica, a Lease as a previous primary left it)."""

from __future__ import annotations

from stream_server.replication.identity import SetIdentity
from stream_server.replication.lease.kube_lease import LeaseClient, LeaseRecord
from stream_server.replication.lease.roles import RoleConfig, RoleLoop
from testkit.cluster import Cluster

DURATION = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replica(
    api: Cluster,
    lease: str,
    name: str,
    clock: Clock,
    position: tuple[int, int] = (0, 0),
    identity: SetIdentity | None = None,
) -> RoleLoop:
    demoted: list[int] = []
    loop = RoleLoop(
        LeaseClient(lease, api.url),
        RoleConfig(
            name=name,
            url=f"http://{name}:4437",
            lease_duration=DURATION,
            renew_deadline=10.0,
            retry_period=2.0,
        ),
        position=lambda: position,
        on_demoted=lambda: demoted.append(1) and None,
        clock=clock,
        identity=identity,
    )
    loop.demoted = demoted  # type: ignore[attr-defined]
    return loop


async def seed(api: Cluster, lease: str, **fields: object) -> LeaseRecord:
    """Write the Lease as a previous primary left it."""
    client = LeaseClient(lease, api.url)
    try:
        return await client.create(LeaseRecord(duration=int(DURATION), **fields))  # type: ignore[arg-type]
    finally:
        await client.close()
