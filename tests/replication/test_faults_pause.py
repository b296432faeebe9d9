"""Pauses longer than the lease (issue 24): a server stopped with SIGSTOP under load.

A paused process runs nothing, but its kernel keeps accepting connections and
buffering what arrives; when it resumes it finds those requests waiting. A
paused primary is replaced meanwhile; once resumed it must acknowledge nothing
(its renew deadline passed while it slept) and must not answer a read as up to
date while it misses the new primary's writes. A paused standby is dropped from
the in-sync set; once resumed it must not serve its stale state as up to date
either. Each pause outlasts the lease and the staleness bound (``PAUSE``);
on loopback.
"""

from __future__ import annotations

import time

import pytest

from testkit.faults.processes import paused
from testkit.history import History
from tests.replication.faultload import (
    BOUND,
    FAST,
    ROUNDS,
    elect,
    loopback_set,
    monitor,
    under_load,
    verdict,
)
from tests.replication.workload import Workload, converged, create_streams, in_sync, until

pytestmark = pytest.mark.processes

STREAMS = 3
# Seconds: a failover, then past the bound by far for the writes the new primary took.
PAUSE = float(FAST["lease_duration"]) + BOUND + 3.0
CLIENT_TIMEOUT = 2.0  # seconds


@pytest.mark.simulated("pause-primary", "pause", "wake-unchecked", "fresh-on-arrival")
@pytest.mark.parametrize("who", ["primary", "standby"])
def test_a_server_paused_longer_than_the_lease_neither_acknowledges_nor_reads_stale(tmp_path, who):
    with loopback_set(tmp_path) as (rs, _):
        streams = [f"pause-{who}/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        # Clients that give up on a paused server soon and try another, as real ones would.
        work = Workload(rs, history, streams, readers=2, timeout=CLIENT_TIMEOUT)
        failovers: list[float] = []
        refused: list[str] = []
        with monitor(rs, history):
            for i in range(ROUNDS):
                primary = in_sync(rs, 2)
                standbys = [s.name for s in rs.servers if s.name != primary]
                victim = primary if who == "primary" else standbys[i % 2]

                def pause(victim: str = victim) -> None:
                    with paused(rs, victim) as at:
                        if who == "primary":
                            failovers.append(elect(rs, victim, at))
                        time.sleep(max(0.0, at + PAUSE - time.monotonic()))  # the fault
                    until(
                        lambda: (rs.status(victim) or {}).get("role") == "standby",
                        f"{victim} a standby after its pause",
                    )

                under_load(work, pause, refused)
                in_sync(rs, 2)
                if refused:
                    break
            final = converged(rs, streams)
        verdict(
            f"paused {who}",
            history,
            final,
            tmp_path,
            failover=max(failovers) if failovers else None,
            refused=refused,
        )
