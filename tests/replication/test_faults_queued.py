"""Writes queued behind a held batch get their refusal in time (issue 24, item 4).

A primary holds a batch at the ack gate until the in-sync replicas have it, and
refuses its writers with 503 + ``Retry-After`` after ``replication_wait``. Batches
written meanwhile queue behind it (they are released in lsn order); their
writers are owed the same: an answer within about ``replication_wait`` of their
request, not whenever the batch ahead of them is released.

The fault, on loopback: both standbys are paused (SIGSTOP) for several times the
wait while the workload writes, and a few probe writes, each to a stream of its
own, are sent to the primary one after another at the start of the pause (so
they are admitted while the standbys still count as in sync, and queue behind
each other at the gate). Every write the primary was sent during the pause must
be answered within ``replication_wait`` plus ``SLACK``.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from testkit.faults.processes import paused
from testkit.history import History, message
from tests.replication.faultload import FAST, ROUNDS, loopback_set, monitor, under_load, verdict
from tests.replication.workload import OCTET, Workload, converged, create_streams, in_sync

pytestmark = pytest.mark.processes

STREAMS = 3
PROBES = 3
WAIT = float(FAST["replication_wait"])
SLACK = 2.0  # seconds over the wait allowed for a loaded 2-core machine: "about" the wait
HOLD = 10.0  # seconds both standbys stay paused: far past WAIT + SLACK


def probe(history: History, url: str, stream: str, token: str, primary: str) -> None:
    """One write, its outcome in the history (503: unknown; it may land later)."""
    op = history.invoke(f"probe-{token}", "append", stream, token=token, server=primary)
    try:
        r = httpx.post(f"{url}{stream}", content=message(token), headers=OCTET, timeout=HOLD + 30)
    except httpx.HTTPError as exc:
        history.complete(op, "info", type(exc).__name__)
        return
    outcome = "ok" if r.status_code in (200, 204) else "info" if r.status_code >= 500 else "fail"
    history.complete(op, outcome, str(r.status_code))


def test_writes_queued_behind_a_held_batch_are_refused_within_the_wait(tmp_path):
    with loopback_set(tmp_path) as (rs, _):
        streams = [f"queued/{i}" for i in range(STREAMS)]
        probes = [f"probe/{i}" for i in range(PROBES)]
        create_streams(rs, streams + probes)
        history = History()
        work = Workload(rs, history, streams, timeout=HOLD + 30)
        holds: list[tuple[str, float, float]] = []  # (primary, paused at, resumed at)
        refused: list[str] = []
        with monitor(rs, history):
            for i in range(ROUNDS):
                primary = in_sync(rs, 2)
                url = rs.server(primary).base
                b, c = [s.name for s in rs.servers if s.name != primary]

                def hold(
                    primary: str = primary, url: str = url, b: str = b, c: str = c, i: int = i
                ) -> None:
                    with paused(rs, b) as at, paused(rs, c):
                        sent = []
                        for j, stream in enumerate(probes):
                            token = f"probe{i}.{j}"
                            args = (history, url, stream, token, primary)
                            sent.append(threading.Thread(target=probe, args=args))
                            sent[-1].start()
                            time.sleep(0.1)
                        time.sleep(HOLD)  # the fault: nothing is replicated
                    holds.append((primary, at, time.monotonic()))
                    for t in sent:
                        t.join()

                under_load(work, hold, refused)
                in_sync(rs, 2)
                if refused:
                    break
            final = converged(rs, streams + probes)
        late = sorted(
            (
                (op.completed or time.monotonic()) - op.invoked,
                f"{op.token} ({op.detail or 'no answer'})",
            )
            for primary, start, end in holds
            for op in history.ops
            if op.kind == "append" and op.server == primary and start <= op.invoked < end
        )
        print(
            f"\nlongest wait for an answer from the primary while its standbys were paused: "
            f"{late[-1][0]:.2f} s ({late[-1][1]}), replication_wait {WAIT:g} s"
        )
        verdict("queued writes", history, final, tmp_path, refused=refused)
        slow = [f"{t} after {s:.2f} s" for s, t in late if s > WAIT + SLACK]
        assert not slow, f"answered later than {WAIT:g} + {SLACK:g} s: {slow[-10:]}"
