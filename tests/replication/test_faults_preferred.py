"""'preferred' durability with min_in_sync = 3 of 3 (issue 24, item 1).

In ``preferred`` durability a primary with fewer than ``min_in_sync`` replicas
in sync acknowledges anyway (and says ``degraded``). That must never mean
acknowledging without a replica that *is* in the in-sync set: such a replica
may be elected next, and whatever it lacks would be lost.

The fault, each server in a network namespace of its own: standby B is cut from
the primary until the primary has removed it from the in-sync set (silent for
``lease_renew_deadline / 2``, ``Shipper.silent_after``); then standby C, still
in the set, is cut too, for less than that (so it stays in the set) while the
writers go on; then the primary is killed (-9) and the cuts healed. C is the only
eligible replica and takes over. Every write the old primary acknowledged must
be on it.
"""

from __future__ import annotations

import time

import pytest

from testkit.faults.processes import kill9
from testkit.history import History
from tests.replication.faultload import (
    NAMESPACES,
    ROUNDS,
    elect,
    monitor,
    namespaced_set,
    under_load,
    verdict,
)
from tests.replication.workload import (
    LIVENESS,
    Workload,
    converged,
    create_streams,
    in_sync,
    until,
)

pytestmark = [pytest.mark.processes, *NAMESPACES]

STREAMS = 3
SETTINGS = {
    "replication_durability": "preferred",
    "min_in_sync": "3",
    "lease_duration": "6",
    "lease_renew_deadline": "4",  # a standby silent for 2 s leaves the in-sync set
    "lease_retry_period": "0.5",
    "replication_wait": "5",  # behind for 4 s (0.8 x this) leaves it too: not reached here
}
WINDOW = 1.0  # seconds C is cut while in the set: half of what would remove it


def test_preferred_never_acknowledges_without_an_in_sync_standby(tmp_path):
    with namespaced_set(tmp_path, SETTINGS) as (rs, net):
        streams = [f"preferred/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        work = Workload(rs, history, streams)
        failovers: list[float] = []
        unreplicated: list[int] = []
        refused: list[str] = []
        with monitor(rs, history):
            for _ in range(ROUNDS):
                old = in_sync(rs, 2)
                b, c = [s.name for s in rs.servers if s.name != old]

                def fault(old: str = old, b: str = b, c: str = c) -> None:
                    net.cut(b, old)
                    until(
                        lambda: b not in (rs.status(old) or {}).get("in_sync", [b]),
                        lambda: f"{b} removed from the in-sync set: {rs.statuses()}",
                    )
                    assert c in rs.status(old)["in_sync"]
                    net.cut(c, old)
                    cut_at = time.monotonic()
                    time.sleep(WINDOW)  # the fault: C in the set, but cut off
                    killed = kill9(rs, [old])
                    unreplicated.append(work.acked_since(cut_at))
                    net.heal()
                    failovers.append(elect(rs, old, killed))

                under_load(work, fault, refused)
                rs.restart(old)  # it follows the new primary (its tail re-copied)
                in_sync(rs, 2)
                if refused:
                    break
            final = converged(rs, streams)
        print(f"\nacknowledged by the old primary while an in-sync standby was cut: {unreplicated}")
        assert rs.primary(timeout=LIVENESS)
        verdict(
            "preferred 3 of 3", history, final, tmp_path, failover=max(failovers), refused=refused
        )
