"""kill -9 of any two of three servers under load (issue 24).

Two of three gone is fewer than a majority: the survivor must acknowledge
nothing until one comes back (required durability), and once both are
restarted the set must hold every acknowledged append, on every replica. The
first round kills the primary and a standby, the second both standbys, later
rounds (FAULT_ROUNDS) a random pair; on loopback. The figure printed as the
failover is the time from the kills to the first acknowledgement after them
(a killed primary, restarted at once, takes its Lease back under a new term).
"""

from __future__ import annotations

import random
import time

import pytest

from testkit.faults.processes import any_subset, kill9
from testkit.history import History
from tests.replication.faultload import (
    ROUNDS,
    first_ack_after,
    loopback_set,
    monitor,
    under_load,
    verdict,
)
from tests.replication.workload import Workload, converged, create_streams, in_sync

pytestmark = pytest.mark.processes

STREAMS = 3
DOWN = 1.0  # seconds both stay dead: the survivor's clients meet the refusals


def test_kill9_of_any_two_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(int(time.time()))
    with loopback_set(tmp_path) as (rs, _):
        streams = [f"kill-two/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        work = Workload(rs, history, streams)
        failovers: list[float] = []
        refused: list[str] = []
        pairs = []
        with monitor(rs, history):
            for i in range(max(ROUNDS, 2)):
                primary = in_sync(rs, 2)
                standbys = sorted(s.name for s in rs.servers if s.name != primary)
                pair = (
                    [primary, standbys[0]]
                    if i == 0
                    else standbys
                    if i == 1
                    else any_subset(rs, 2, rng)
                )
                pairs.append(pair)

                killed: list[float] = []

                def kill(pair: list[str] = pair, killed: list[float] = killed) -> None:
                    killed.append(kill9(rs, pair))
                    time.sleep(DOWN)  # the fault: one server of three left
                    for name in pair:
                        rs.restart(name)

                under_load(work, kill, refused)
                in_sync(rs, 2)
                failovers.append(first_ack_after(history, killed[0]) or 0.0)
                if refused:
                    break
            final = converged(rs, streams)
        print(f"\nkilled: {pairs}")
        verdict(
            "kill -9 of two",
            history,
            final,
            tmp_path,
            failover=max(failovers),
            refused=refused,
        )
