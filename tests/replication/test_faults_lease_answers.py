"""A Lease write whose answer is lost (issue 24, item 2).

The primary adds a standby that caught up (the joiner) to the in-sync set by a
CAS on the Lease; from that write on, the joiner may be elected, so every later
acknowledgement must wait for it. Here the write reaches the API server and
happens, but its answer never comes back (``ApiProxy.lose_answer``: the
connection is cut after the API server answered), and from then on the primary
cannot reach the API at all. The primary does not know whether the joiner is in
the set; invariant: "an outcome the primary does not know is read back before it
is acted on" (and while it cannot be read back, the worse case holds).

The fault, on loopback, each server with its own proxy to the API: the joiner
is killed the moment the write happened, the primary goes on for a short window,
then the primary and the other standby are killed too; the joiner, restarted
alone, is eligible (the Lease lists it) and takes over. Every write acknowledged
before must be on it.
"""

from __future__ import annotations

import json
import time

import pytest

from testkit.faults.processes import kill9
from testkit.history import History
from testkit.replicaset import ReplicaSet
from tests.replication.faultload import (
    FAILOVER_PATIENCE,
    ROUNDS,
    loopback_set,
    monitor,
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

pytestmark = pytest.mark.processes

STREAMS = 3
IN_SYNC = "streams.pyds.dev/in-sync"
WINDOW = 0.6  # seconds the primary goes on after the lost answer (its renew deadline is 2)


def adds(joiner: str):
    """A predicate on a Lease PUT's body: it puts ``joiner`` in the in-sync set."""

    def predicate(body) -> bool:
        notes = ((body or {}).get("metadata") or {}).get("annotations") or {}
        return joiner in json.loads(notes.get(IN_SYNC) or "[]")

    return predicate


def out_of_sync(rs: ReplicaSet, primary: str, name: str) -> None:
    until(
        lambda: name not in (rs.status(primary) or {}).get("in_sync", [name]),
        lambda: f"{name} out of the in-sync set: {rs.statuses()}",
    )


def test_a_joiner_whose_in_sync_write_lost_its_answer_is_elected_with_everything(tmp_path):
    with loopback_set(tmp_path, proxies=True) as (rs, proxies):
        streams = [f"lost-answer/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        history = History()
        work = Workload(rs, history, streams)
        failovers: list[float] = []
        after_loss: list[int] = []
        refused: list[str] = []
        with monitor(rs, history):
            for i in range(ROUNDS):
                old = in_sync(rs, 2)
                standbys = [s.name for s in rs.servers if s.name != old]
                joiner = standbys[i % 2]
                other = standbys[(i + 1) % 2]

                def fault(old: str = old, joiner: str = joiner, other: str = other) -> None:
                    kill9(rs, [joiner])
                    out_of_sync(rs, old, joiner)
                    rule = proxies[old].lose_answer(
                        "PUT", "/leases/", adds(joiner), then="blackhole"
                    )
                    rs.restart(joiner)  # it catches up, and the primary adds it: lost answer
                    assert rule.fired.wait(LIVENESS), f"no Lease write added {joiner}"
                    kill9(rs, [joiner])
                    time.sleep(WINDOW)  # the fault: the primary writes on, the joiner gone
                    killed = kill9(rs, [old, other])
                    after_loss.append(work.acked_since(rule.at[0]))
                    proxies[old].heal()
                    rs.restart(joiner)  # alone: the Lease lists it in sync, so it may take over
                    rs.primary(timeout=FAILOVER_PATIENCE, exclude=(old, other))
                    failovers.append(time.monotonic() - killed)
                    rs.restart(old)
                    rs.restart(other)

                under_load(work, fault, refused)
                in_sync(rs, 2)
                if refused:
                    break
            final = converged(rs, streams)
        print(f"\nacknowledged after the lost answer, before the kills: {after_loss}")
        verdict(
            "lost Lease answer", history, final, tmp_path, failover=max(failovers), refused=refused
        )
