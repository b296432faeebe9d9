"""Partitions (issue 24): each server in a network namespace of its own, cut with iptables.

- A standby isolated from the primary, the other standby and the API, while the
  test's readers still reach it: it must not answer a read as up to date once it
  may miss writes acknowledged more than the staleness bound ago.
- The primary isolated the same way: the set fails over, and the deposed primary
  must neither acknowledge nor serve a stale read as up to date.
- The primary cut from its standbys but not from the API: it can renew the Lease
  but replicate nothing, so the set must fail over to the standbys, which still
  form a quorum, and writes resume there; nothing acknowledged is lost.

Each cut lasts longer than the bound (the sleep *is* the fault); every wait for
the set is a liveness bound. Real processes, real TCP; see ``faultload.py``.
"""

from __future__ import annotations

import time

import pytest

from testkit.history import History
from tests.replication.faultload import (
    BOUND,
    NAMESPACES,
    ROUNDS,
    elect,
    monitor,
    namespaced_set,
    under_load,
    verdict,
)
from tests.replication.workload import Workload, converged, create_streams, in_sync

pytestmark = [pytest.mark.processes, *NAMESPACES]

STREAMS = 3
PAST_BOUND = 3.0  # seconds a cut outlasts the staleness bound


def test_an_isolated_standby_serves_no_read_as_up_to_date_past_the_bound(tmp_path):
    with namespaced_set(tmp_path) as (rs, net):
        streams = [f"cut-standby/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        work = Workload(rs, history, streams, readers=2)
        refused: list[str] = []
        with monitor(rs, history):
            for i in range(ROUNDS):
                primary = in_sync(rs, 2)
                standbys = [s.name for s in rs.servers if s.name != primary]
                victim = standbys[i % len(standbys)]

                def isolate(victim: str = victim) -> None:
                    net.isolate(victim)  # from its peers and the API; the readers still reach it
                    time.sleep(BOUND + PAST_BOUND)
                    net.heal(victim)

                if not under_load(work, isolate, refused):
                    break
            in_sync(rs, 2)
            final = converged(rs, streams)
        verdict("isolated standby", history, final, tmp_path, refused=refused)


def test_an_isolated_primary_is_replaced_and_serves_no_read_as_up_to_date(tmp_path):
    with namespaced_set(tmp_path) as (rs, net):
        streams = [f"cut-primary/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        work = Workload(rs, history, streams, readers=2)
        failovers: list[float] = []
        refused: list[str] = []
        with monitor(rs, history):
            for _ in range(ROUNDS):
                old = in_sync(rs, 2)

                def isolate(old: str = old) -> None:
                    at = time.monotonic()
                    net.isolate(old)
                    failovers.append(elect(rs, old, at))
                    time.sleep(BOUND + PAST_BOUND)  # writes go on at the new primary
                    net.heal(old)

                if not under_load(work, isolate, refused):
                    break
            in_sync(rs, 2)
            final = converged(rs, streams)
        verdict(
            "isolated primary", history, final, tmp_path, failover=max(failovers), refused=refused
        )


def test_a_primary_cut_from_its_standbys_but_not_the_api_is_replaced(tmp_path):
    with namespaced_set(tmp_path) as (rs, net):
        streams = [f"cut-from-standbys/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        work = Workload(rs, history, streams)
        failovers: list[float] = []
        refused: list[str] = []
        with monitor(rs, history):
            for _ in range(ROUNDS):
                old = in_sync(rs, 2)

                def cut(old: str = old) -> None:
                    at = time.monotonic()
                    for other in rs.servers:
                        if other.name != old:
                            net.cut(old, other.name)  # both ways; API and CLIENTS stay
                    failovers.append(elect(rs, old, at))
                    # load_until now waits for every writer to be acknowledged again

                ok = under_load(work, cut, refused)
                net.heal(old)
                if not ok:
                    break
            in_sync(rs, 2)
            final = converged(rs, streams)
        verdict(
            "primary cut from standbys",
            history,
            final,
            tmp_path,
            failover=max(failovers),
            refused=refused,
        )
