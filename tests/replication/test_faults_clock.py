"""A slow clock on the primary (issue 24, items 6 and 7).

A primary stops acknowledging when it could not renew the Lease for
``lease_renew_deadline``, shorter than ``lease_duration``, after which alone
another replica may take over; both are measured by each replica's own clock.
With the primary's clock running at ``RATE`` times real time (libfaketime,
monotonic included: ``testkit.faults.clock``), its renew deadline lasts
1/``RATE`` times longer in real time, past the moment a standby takes over.

The fault, on loopback, each server with its own proxy to the API: the slow
primary is cut from the API (its proxy refuses every request), so it cannot
renew; a standby takes over. Nothing acknowledged may be lost, no
acknowledgement may come from it once the new primary was seen, and its
``GET /replication`` must not say ``primary`` for long after the new one is
(``TOLERANCE``). In ``preferred`` durability with ``min_in_sync`` 3 of 3 and one
standby down, the slow primary acknowledges alone: writes it acknowledges once
the other has taken over are lost unless it stops in time.
"""

from __future__ import annotations

import pytest

from testkit import needs
from testkit.faults.clock import library, measured_rate, slow_clock
from testkit.faults.processes import kill9
from testkit.history import History
from tests.replication.faultload import (
    FAST,
    ROUNDS,
    claimed_primary_after,
    elect,
    loopback_set,
    monitor,
    under_load,
    verdict,
)
from tests.replication.workload import (
    Workload,
    converged,
    create_streams,
    in_sync,
    until,
)

pytestmark = [
    pytest.mark.processes,
    needs.commands("faketime", install="Debian's faketime (make system-deps)"),
]

STREAMS = 3
SLOW = "ds-0"  # started first, so it creates the Lease and is the first primary
RATE = 0.25  # its renew deadline (2 s) lasts 8 s of real time; the lease is 3 s
# Seconds the deposed primary may still say "primary" after the new one was seen: a
# role round (lease_retry_period) and a second for a loaded machine. Its clock being
# slow is no excuse: the others' clocks are right.
TOLERANCE = float(FAST["lease_retry_period"]) + 1.0


@pytest.mark.parametrize(
    ("durability", "min_in_sync"), [("required", "0"), ("preferred", "3")], ids=str
)
def test_a_slow_clock_primary_cut_from_the_api_stops_in_time(tmp_path, durability, min_in_sync):
    if library() is None:
        needs.missing("libfaketime is not installed (Debian's faketime: make system-deps)")
    rate = measured_rate(slow_clock(RATE), 0.5)
    assert rate < (RATE + 1) / 2, f"libfaketime did not slow the clock: {rate:.2f} x real time"
    settings = FAST | {"replication_durability": durability, "min_in_sync": min_in_sync}
    env = lambda name: slow_clock(RATE) if name == SLOW else {}  # noqa: E731
    with loopback_set(tmp_path, settings, proxies=True, env=env) as (rs, proxies):
        streams = [f"slow-clock/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        work = Workload(rs, history, streams)
        failovers: list[float] = []
        overlaps: list[float] = []
        refused: list[str] = []
        with monitor(rs, history):
            for _ in range(ROUNDS):
                if in_sync(rs, 2) != SLOW:
                    assert rs.switchover(to=SLOW, timeout=30).status_code == 200
                    in_sync(rs, 2)
                term = rs.status(SLOW)["term"]
                down = next(s.name for s in rs.servers if s.name != SLOW)

                def fault(term: int = term, down: str = down) -> None:
                    if durability == "preferred":  # 2 of 3 in sync: it acknowledges alone
                        kill9(rs, [down])
                        until(
                            lambda: down not in rs.status(SLOW)["in_sync"],
                            f"{down} out of the in-sync set",
                        )
                    proxies[SLOW].cut("refuse")
                    failovers.append(elect(rs, SLOW, proxies[SLOW].fired[-1][0]))
                    until(
                        lambda: (rs.status(SLOW) or {}).get("role") == "standby",
                        f"{SLOW} a standby again",
                    )
                    overlaps.append(claimed_primary_after(history, SLOW, term))
                    proxies[SLOW].heal()
                    if durability == "preferred":
                        rs.restart(down)

                under_load(work, fault, refused)
                in_sync(rs, 2)
                if refused:
                    break
            final = converged(rs, streams)
        print(
            f"\n{SLOW} at {rate:.2f} x real time said primary up to {max(overlaps):.2f} s after "
            f"a new primary was seen (tolerance {TOLERANCE:g} s)"
        )
        verdict(
            f"slow clock, {durability}",
            history,
            final,
            tmp_path,
            failover=max(failovers),
            refused=refused,
        )
        assert max(overlaps) <= TOLERANCE, (
            f"{SLOW} (clock at {RATE} x) said primary {max(overlaps):.2f} s after another "
            f"primary was seen at a higher term"
        )
