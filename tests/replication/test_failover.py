"""Failover end to end: real server processes, a real (emulated) Kubernetes API, kill -9.

Three servers form a replica set (``testkit.replicaset``). The workload of
``workload.py`` (plain writers, idempotent producers, readers on every
replica) appends to a few streams while the test kills servers.

Every invocation and result goes into a ``testkit.history.History``; once the
set has converged, every replica must hold byte-identical streams and the
checker must find nothing: every acknowledged append present exactly once and
in its client's order, nothing refused present, no read that returned data
later missing.

The waits below are liveness bounds (generous, for 2 shared cores), never
speed requirements: the failover time is printed, not asserted. Rounds:
FAILOVER_ROUNDS (default 1) primaries killed one after the other.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit import wait_for
from testkit.history import History, message
from testkit.replicaset import ReplicaSet
from testkit.server_process import children_of, process_state
from tests.replication.workload import (
    LIVENESS,
    OCTET,
    Workload,
    converged,
    create_streams,
    in_sync,
    load_until,
    recopies_of,
    until,
    verdict,
)

pytestmark = pytest.mark.processes

ROUNDS = int(os.environ.get("FAILOVER_ROUNDS", "1"))
STREAMS = 3
# Short leases so that a failover takes seconds; replication_wait short so that a write
# with too few replicas in sync is refused soon. Liveness bounds below are far above these.
FAST = {
    "lease_duration": "3",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.5",
    "replication_wait": "2",
}


@pytest.fixture
def replica_set(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ReplicaSet]:
    """Three servers; a test marked ``workers(N)`` runs each with ``--workers N``."""
    marker = request.node.get_closest_marker("workers")
    workers = ("--workers", str(marker.args[0])) if marker else ()
    rs = ReplicaSet.up(
        3, tmp_path / "rs", settings=FAST, args=("--long-poll-timeout", "2", *workers)
    )
    try:
        yield rs
    finally:
        rs.down()


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.simulated("crash-primary", "commit-one-short", "ack-before-flush")
def test_kill9_of_the_primary_under_load_loses_nothing_acknowledged(replica_set, tmp_path):
    _kill9_of_the_primary_under_load(replica_set, tmp_path)


@pytest.mark.workers(2)
def test_kill9_of_a_primary_of_two_workers_under_load_loses_nothing_acknowledged(
    replica_set, tmp_path
):
    """The same with every server a writer and two worker processes: the kill is the
    writer's (its process group: the pod's container), its workers go with it."""
    _kill9_of_the_primary_under_load(replica_set, tmp_path)


def _kill9_of_the_primary_under_load(rs: ReplicaSet, tmp_path: Path) -> None:
    streams = [f"failover/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    history = History()
    failovers: list[tuple[float, float]] = []
    work = Workload(rs, history, streams)
    for _ in range(ROUNDS):
        old = in_sync(rs, 2)
        elected: dict[str, float] = {}

        def kill_primary(old: str = old, elected: dict[str, float] = elected) -> None:
            elected["killed"] = time.monotonic()
            rs.kill(old, signal.SIGKILL)
            new = rs.primary(timeout=LIVENESS, exclude=(old,))
            elected["seconds"] = time.monotonic() - elected["killed"]
            assert new.name != old

        asyncio.run(load_until(work, kill_primary))
        # The first write the new primary acknowledged: what a client waited, at best.
        first_ack = min(
            op.completed
            for op in history.ops
            if op.kind == "append"
            and op.outcome == "ok"
            and op.server != old
            and op.completed
            and op.completed > elected["killed"]
        )
        failovers.append((elected["seconds"], first_ack - elected["killed"]))
        rs.restart(old)  # it rejoins as a standby and drops its unacknowledged tail
        final = converged(rs, streams)
    verdict(history, final, tmp_path)
    for i, (elected_s, ack_s) in enumerate(failovers):
        print(
            f"failover {i + 1}: new primary after {elected_s:.2f} s, first acknowledged "
            f"append after {ack_s:.2f} s (lease_duration {FAST['lease_duration']} s)"
        )


def test_too_few_standbys_in_sync_gets_503_not_an_acknowledgement(replica_set, tmp_path):
    rs = replica_set
    streams = ["quorum/0"]
    create_streams(rs, streams)
    primary = in_sync(rs, 2)
    history = History()

    def append(token: str, server: str) -> httpx.Response:
        op = history.invoke("w0", "append", streams[0], token=token, server=server)
        r = httpx.post(
            f"{rs.server(server).base}{streams[0]}",
            content=message(token),
            headers=OCTET,
            timeout=30,
        )
        outcome = (
            "ok" if r.status_code in (200, 204) else "info" if r.status_code >= 500 else "fail"
        )
        history.complete(op, outcome, str(r.status_code))
        return r

    assert append("w0.0", primary).status_code == 204
    standbys = [s.name for s in rs.servers if s.name != primary]
    for name in standbys:
        rs.kill(name, signal.SIGKILL)
    refused = append("w0.1", primary)
    assert refused.status_code == 503, refused.text  # 1 of 3 is fewer than a majority
    assert refused.headers.get("retry-after")
    assert rs.status(primary)["role"] == "primary"
    for name in standbys:
        rs.restart(name)
    # Without a majority the primary may also have given the Lease up (it cannot renew
    # what it cannot vouch for), and a restarted replica then leads: writes go to
    # whoever is primary once two are in sync again.
    # A 503 from a replica that stepped down just after it was seen primary is a refusal
    # (recorded as such); the client goes to the primary again, as Retry-After asks.
    tokens = (f"w0.{i}" for i in itertools.count(2))
    wait_for(
        lambda: append(next(tokens), in_sync(rs, 2)).status_code == 204,
        timeout=60,
        message="an append acknowledged once two standbys are in sync again",
    )
    verdict(history, converged(rs, streams), tmp_path)


@pytest.mark.simulated("crash")
def test_kill9_of_a_standby_under_load_then_it_catches_up(replica_set, tmp_path):
    rs = replica_set
    streams = [f"standby/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    primary = in_sync(rs, 2)
    victim = next(s.name for s in rs.servers if s.name != primary)
    history = History()
    work = Workload(rs, history, streams)
    # 2 of 3 remain: writes go on once the primary has dropped the dead standby from the ISR.
    asyncio.run(load_until(work, lambda: rs.kill(victim, signal.SIGKILL)))
    assert rs.primary(timeout=LIVENESS).name == primary  # a standby's death moves nothing
    rs.restart(victim)
    in_sync(rs, 2)  # caught up and back in the ISR
    verdict(history, converged(rs, streams), tmp_path)


@pytest.mark.simulated("crash-all", "ack-before-flush")
def test_all_killed_and_restarted_together_keeps_every_acknowledged_append(replica_set, tmp_path):
    rs = replica_set
    streams = [f"coldstart/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    in_sync(rs, 2)
    history = History()

    def kill_all() -> None:
        for s in rs.servers:
            rs.kill(s.name, signal.SIGKILL)
        for s in rs.servers:
            rs.restart(s.name)

    work = Workload(rs, history, streams)
    asyncio.run(load_until(work, kill_all))
    in_sync(rs, 2)
    verdict(history, converged(rs, streams), tmp_path)


def test_a_standby_behind_at_a_cold_start_catches_up_by_frames_not_a_recopy(replica_set):
    """A standby left out of the in-sync set (paused) misses some appends; then all
    three are killed and restarted. The new primary's frames were only in its WAL,
    which recovery replays and retires: it must still ship them (engine/replica.py,
    ``replayed``), so the standby catches up without re-copying everything."""
    rs = replica_set
    stream = "behind/0"
    create_streams(rs, [stream])
    primary = in_sync(rs, 2)
    lagger = next(s.name for s in rs.servers if s.name != primary)
    recopies = recopies_of(rs, lagger)
    rs.kill(lagger, signal.SIGSTOP)
    until(
        lambda: lagger not in (rs.status(primary) or {}).get("in_sync", [lagger]),
        lambda: f"{lagger} out of the in-sync set: {rs.statuses()}",
    )
    url = f"{rs.server(primary).base}{stream}"
    sent = [message(f"missed.{i}") for i in range(5)]
    for body in sent:
        r = httpx.post(url, content=body, headers=OCTET, timeout=30)
        assert r.status_code == 204, r.text
    for s in rs.servers:
        rs.kill(s.name, signal.SIGKILL)
    for s in rs.servers:
        rs.restart(s.name)
    in_sync(rs, 2)
    final = converged(rs, [stream])
    assert final[stream].endswith(b"".join(sent))
    assert recopies_of(rs, lagger) == recopies


@pytest.mark.simulated("pause-primary", "wake-unchecked")
def test_a_paused_primary_acknowledges_nothing_more_and_rejoins(replica_set, tmp_path):
    """SIGSTOP past the Lease while writes go on at a new primary, then SIGCONT."""
    rs = replica_set
    streams = [f"paused/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    old = in_sync(rs, 2)
    history = History()

    stopped: list[float] = []

    def pause() -> None:
        rs.kill(old, signal.SIGSTOP)
        stopped.append(time.monotonic())  # it runs nothing from here until SIGCONT
        rs.primary(timeout=LIVENESS, exclude=(old,))

    work = Workload(rs, history, streams)
    asyncio.run(load_until(work, pause))
    rs.kill(old, signal.SIGCONT)
    # Thawed, it must not take a write: it lost the Lease while it slept. It refuses it
    # (503), or it is already restarting into a re-copy of the new primary's data (its
    # tail diverged), so that the write gets no answer: either way it is nowhere after.
    late_write = message("late.0")
    try:
        r: httpx.Response | None = httpx.post(
            f"{rs.server(old).base}{streams[0]}", content=late_write, headers=OCTET, timeout=30
        )
    except httpx.TransportError:
        r = None
    assert r is None or r.status_code == 503, (r.status_code, r.text)
    until(lambda: (rs.status(old) or {}).get("role") == "standby", f"{old} back as a standby")
    late = [
        op.token
        for op in history.ops
        if op.kind == "append"
        and op.server == old
        and op.outcome == "ok"
        and op.invoked > stopped[0]
    ]
    assert not late, f"{old} acknowledged writes sent after it was paused: {late[:10]}"
    in_sync(rs, 2)
    final = converged(rs, streams)
    assert late_write not in final[streams[0]]
    verdict(history, final, tmp_path)


@pytest.mark.workers(2)
def test_a_recopied_standby_of_two_workers_stops_and_reaps_them_before_it_execs(replica_set):
    """A wiped standby copies the primary's data whole and execs itself again (the same
    pid): its workers stop first and are reaped, and its new image starts two of its
    own, so none is left behind as a zombie of the new image."""
    rs = replica_set
    stream = "recopied/0"
    create_streams(rs, [stream])
    primary = in_sync(rs, 2)
    body = message("kept")
    r = httpx.post(f"{rs.server(primary).base}{stream}", content=body, headers=OCTET, timeout=30)
    assert r.status_code == 204, r.text
    wiped = next(s.name for s in rs.servers if s.name != primary)
    # All down (SIGTERM: a clean stop retires the WAL), so no primary holds the frames
    # the wiped standby would need after the start: it re-copies.
    for s in rs.servers:
        rs.kill(s.name, signal.SIGTERM)
    for s in rs.servers:
        until(lambda name=s.name: not rs.alive(name), f"{s.name} stopped")
    shutil.rmtree(rs.server(wiped).data_dir)
    for s in rs.servers:
        rs.restart(s.name)
    log = Path(rs.server(wiped).log)
    started = re.compile(r"worker \d started \(pid (\d+)\)")

    def workers_around_the_exec() -> tuple[list[int], list[int]] | None:
        """The workers started before the re-copy's exec (the last two) and after it."""
        before, installed, after = log.read_text(errors="replace").rpartition("re-copy installed")
        old, new = started.findall(before)[-2:], started.findall(after)
        return (
            ([int(p) for p in old], [int(p) for p in new]) if installed and len(new) >= 2 else None
        )

    old, new = until(workers_around_the_exec, lambda: f"{wiped} re-copied, its workers started")
    assert body in converged(rs, [stream])[stream]
    writer = rs.server(wiped).pid
    assert len(old) == 2 and len(new) == 2, (old, new)
    states = [process_state(pid) for pid in old]
    assert states == [None, None], f"the first image's workers {old} not reaped: {states}"
    until(lambda: sorted(children_of(writer)) == sorted(new), f"{wiped} runs workers {new}")
