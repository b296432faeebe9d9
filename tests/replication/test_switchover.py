"""Switchover (``POST /replication/switchover``) on a real replica set: real server
processes from ``testkit.replicaset`` (peer token on), the emulated Lease API.

Under the failover tests' workload (plain writers, idempotent producers that
retry on 503 and follow ``Stream-Primary``, readers on every replica), the
primary hands over to a standby: the history checker must find every
acknowledged append exactly once, nothing the old primary refused during the
switch in any stream, and every replica byte-identical afterwards. The pause
writers see is printed (``pytest -s``), never asserted.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit import wait_for
from testkit.history import History, message
from testkit.replicaset import ReplicaSet
from tests.replication.workload import (
    OCTET,
    Workload,
    converged,
    create_streams,
    in_sync,
    load_until,
    recopies_of,
    verdict,
)

pytestmark = pytest.mark.processes

# Short leases (testkit.replica_set_processes' FAST timings) so the set forms and settles in seconds.
FAST = {
    "lease_duration": "3",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.3",
    "replication_wait": "5",
}
STREAMS = 2


@pytest.fixture(scope="module")
def rs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    """One set for the module: each test starts from whichever replica is primary."""
    root = tmp_path_factory.mktemp("switchover")
    s = ReplicaSet.up(3, root / "rs", settings=FAST, args=("--long-poll-timeout", "2"))
    try:
        yield s
    finally:
        s.down()


def lease_of(rs: ReplicaSet) -> dict[str, Any]:
    """The holder, the term and how the term began (``term-began``) that the Lease
    names, from the API server itself."""
    namespace, name = rs.lease.split("/")
    r = httpx.get(
        f"{rs.api}/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", timeout=5
    )
    r.raise_for_status()
    obj = r.json()
    return {
        "holder": obj["spec"]["holderIdentity"],
        "term": int(obj["metadata"]["annotations"]["streams.pyds.dev/term"]),
        "began": obj["metadata"]["annotations"].get("streams.pyds.dev/term-began"),
    }


def test_switchover_under_load_loses_nothing_and_the_old_primary_follows(rs, tmp_path):
    streams = [f"switch/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    old = in_sync(rs, 2)
    term = lease_of(rs)["term"]
    recopies = recopies_of(rs, old)
    history = History()
    work = Workload(rs, history, streams)
    answer: dict[str, Any] = {}

    def switch() -> None:
        answer["started"] = time.monotonic()
        r = rs.switchover()
        answer["ended"] = time.monotonic()
        assert r.status_code == 200, r.text
        answer.update(r.json())

    asyncio.run(load_until(work, switch))
    new = answer["primary"]
    assert new != old
    assert answer["term"] == term + 1
    assert lease_of(rs) == {"holder": new, "term": term + 1, "began": "switchover"}
    assert rs.primary(timeout=30).name == new
    new_url = rs.server(new).url
    wait_for(
        lambda: (st := rs.status(old)) and st["role"] == "standby" and st["primary"] == new_url,
        timeout=30,
        message=lambda: f"{old} following {new}: {rs.statuses()}",
    )
    in_sync(rs, 2)  # the old primary holds the new primary's frames too
    verdict(history, converged(rs, streams), tmp_path)
    # The old primary wrote nothing past what the target holds: it followed on, without
    # the re-copy that a diverged tail (a failover's unacknowledged writes) needs.
    assert recopies_of(rs, old) == recopies
    # Held writes were answered by the old primary with the new one's address.
    redirected = [
        op for op in history.ops if op.server == old and op.detail.startswith("503 from a standby")
    ]
    print(f"\nswitchover {old} -> {new} (term {answer['term']}): {pause_report(history, answer)}")
    print(f"writes the old primary refused with Stream-Primary: {len(redirected)}")


def pause_report(history: History, answer: dict[str, Any]) -> str:
    """The pause as the server measured it and as the writers saw it: the longest
    stretch without any acknowledgement that overlaps the switchover request."""
    acks = sorted(
        op.completed
        for op in history.ops
        if op.kind == "append" and op.outcome == "ok" and op.completed is not None
    )
    longest = max(
        (
            b - a
            for a, b in itertools.pairwise(acks)
            if b >= answer["started"] and a <= answer["ended"]
        ),
        default=float("nan"),
    )
    return (
        f"writes held {answer['paused_ms']} ms by the server; writers' longest stretch "
        f"without an acknowledgement around it {longest * 1e3:.0f} ms (the request, "
        f"harness included: {(answer['ended'] - answer['started']) * 1e3:.0f} ms)"
    )


def test_switchover_to_a_standby_out_of_sync_or_unknown_is_refused_and_changes_nothing(rs):
    streams = ["switch-refused/0"]
    create_streams(rs, streams)
    primary = in_sync(rs, 2)
    standbys = [s.name for s in rs.servers if s.name != primary]
    before = lease_of(rs)
    r = rs.switchover("ds-9")
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "NOT_IN_SYNC"
    r = rs.switchover(primary)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "NOT_IN_SYNC"
    stopped: list[str] = []
    try:
        # Paused standbys stop acknowledging and leave the in-sync set (by CAS) within a second.
        rs.kill(standbys[0], signal.SIGSTOP)
        stopped.append(standbys[0])
        wait_for(
            lambda: standbys[0] not in (rs.status(primary) or {}).get("in_sync", [standbys[0]]),
            timeout=30,
            message=lambda: f"{standbys[0]} out of the in-sync set: {rs.status(primary)}",
        )
        r = rs.switchover(standbys[0])
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "NOT_IN_SYNC"
        assert lease_of(rs) == before
        assert rs.status(primary)["role"] == "primary"
    finally:
        for name in stopped:
            rs.kill(name, signal.SIGCONT)
    in_sync(rs, 2)
    assert rs.primary().name == primary
    assert lease_of(rs) == before
    r = httpx.post(
        f"{rs.server(primary).base}{streams[0]}", content=message("after.0"), headers=OCTET
    )
    assert r.status_code == 204, r.text


def test_with_every_standby_gone_no_switchover_and_the_lease_goes_to_the_eligible(rs):
    """Both standbys paused: no switchover target (NO_CANDIDATE); they stay eligible
    (nothing could be acknowledged without them), so the primary, below its quorum
    for a renew deadline, gives the Lease up for one of them (a primary cut off from
    its standbys but not from the API would otherwise refuse writes for as long as
    the cut lasts). Once they are back the set has a primary with both in sync."""
    streams = ["switch-no-candidate/0"]
    create_streams(rs, streams)
    primary = in_sync(rs, 2)
    standbys = [s.name for s in rs.servers if s.name != primary]
    before = lease_of(rs)
    try:
        for name in standbys:
            rs.kill(name, signal.SIGSTOP)
        wait_for(
            lambda: not (rs.status(primary) or {}).get("in_sync", ["?"]),
            timeout=30,
            message=lambda: f"no standby in sync: {rs.status(primary)}",
        )
        r = rs.switchover()
        # Refused either way; NOT_PRIMARY once it gave the Lease up (a renew deadline
        # after the in-sync set emptied).
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] in ("NO_CANDIDATE", "NOT_PRIMARY")
        # Given up (holder empty, same term); with nobody else able to take it, the
        # old primary takes it back a lease duration later, under a new term.
        wait_for(
            lambda: lease_of(rs)["term"] > before["term"],
            timeout=30,
            message=lambda: f"the primary gave the Lease up: {lease_of(rs)}",
        )
        # Still nothing acknowledged without them: they stay eligible.
        assert set(standbys) <= set(lease_eligible(rs))
    finally:
        for name in standbys:
            rs.kill(name, signal.SIGCONT)
    now = in_sync(rs, 2)
    r = httpx.post(f"{rs.server(now).base}{streams[0]}", content=message("after.0"), headers=OCTET)
    assert r.status_code == 204, r.text


def lease_eligible(rs: ReplicaSet) -> list[str]:
    namespace, name = rs.lease.split("/")
    r = httpx.get(
        f"{rs.api}/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", timeout=5
    )
    r.raise_for_status()
    return json.loads(r.json()["metadata"]["annotations"].get("streams.pyds.dev/eligible", "[]"))


def test_a_switchover_whose_target_does_not_catch_up_is_undone(rs):
    """The target is paused while a write it has not confirmed is in flight: past the
    switchover's timeout the primary answers 503 NOT_SWITCHED, stays primary under the
    same term, takes writes again, and the write in flight is answered."""
    streams = ["switch-undone/0"]
    create_streams(rs, streams)
    primary = in_sync(rs, 2)
    target = next(s.name for s in rs.servers if s.name != primary)
    before = lease_of(rs)
    url = f"{rs.server(primary).base}{streams[0]}"
    answers: list[httpx.Response] = []
    lsn = rs.status(primary)["durable"]["lsn"]  # type: ignore[index]
    rs.kill(target, signal.SIGSTOP)
    try:
        writer = threading.Thread(
            target=lambda: answers.append(
                httpx.post(url, content=message("held.0"), headers=OCTET, timeout=30)
            )
        )
        writer.start()
        # The write is durable on the primary and waits for the paused target's acknowledgement.
        wait_for(
            lambda: rs.status(primary)["durable"]["lsn"] > lsn,  # type: ignore[index]
            timeout=10,
            message="the write durable on the primary",
        )
        # Straight to the primary: rs.switchover would first ask every replica (the
        # paused one too) which is primary, long enough for the target to leave the set.
        r = httpx.post(
            f"{rs.server(primary).url}/replication/switchover",
            json={"to": target, "timeout": 0.5},
            headers=rs.peer_headers(),
            timeout=10,
        )
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "NOT_SWITCHED", r.text
        assert r.headers["retry-after"] == "1"
        assert lease_of(rs) == before
        assert rs.status(primary)["role"] == "primary"  # type: ignore[index]
    finally:
        rs.kill(target, signal.SIGCONT)
    writer.join(timeout=60)
    assert [a.status_code for a in answers] == [204], [a.text for a in answers]
    in_sync(rs, 2)
    assert lease_of(rs) == before
    r = httpx.post(url, content=message("after.0"), headers=OCTET, timeout=30)
    assert r.status_code == 204, r.text


def test_switchover_on_a_standby_is_refused_with_the_primary(rs):
    primary = in_sync(rs, 2)
    standby = next(s for s in rs.servers if s.name != primary)
    before = lease_of(rs)
    r = httpx.post(
        f"{standby.url}/replication/switchover", headers=rs.peer_headers(), json={}, timeout=10
    )
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "NOT_PRIMARY"
    assert r.headers["stream-primary"] == rs.server(primary).url
    assert lease_of(rs) == before


def test_the_command_line_switches_over_through_the_state_file(rs, tmp_path: Path):
    from testkit.replicaset import main

    old = in_sync(rs, 2)
    target = next(s.name for s in rs.servers if s.name != old)
    term = lease_of(rs)["term"]
    assert main(["switchover", "--state-file", str(rs.state_file), "--to", target]) == 0
    assert lease_of(rs) == {"holder": target, "term": term + 1, "began": "switchover"}
    assert rs.primary(timeout=30).name == target
    # A second one to the same (now primary) replica is refused: it is not a standby.
    assert main(["switchover", "--state-file", str(rs.state_file), "--to", target]) == 1


def test_a_primary_stopped_by_sigterm_hands_over_first_and_loses_nothing(tmp_path):
    """A node drain: the primary gets SIGTERM under load. It hands the Lease to an
    in-sync standby before it exits, so the next primary comes at ``term + 1`` by a
    hand-over, not by the Lease running out: with a 60 s lease, nothing else could
    make one within the test's patience. Restarted, the old primary follows on
    without a re-copy (it wrote nothing past what the target holds)."""
    slow = {**FAST, "lease_duration": "60", "lease_renew_deadline": "40"}
    rs = ReplicaSet.up(3, tmp_path / "rs", settings=slow, args=("--long-poll-timeout", "2"))
    try:
        streams = [f"drain/{i}" for i in range(STREAMS)]
        create_streams(rs, streams)
        old = in_sync(rs, 2)
        term = lease_of(rs)["term"]
        history = History()
        work = Workload(rs, history, streams)
        stopped: dict[str, Any] = {}

        def drain() -> None:
            stopped["at"] = time.monotonic()
            rs.kill(old, signal.SIGTERM)
            stopped["new"] = rs.primary(timeout=30, exclude=(old,)).name
            stopped["after"] = time.monotonic() - stopped["at"]

        asyncio.run(load_until(work, drain))
        new = stopped["new"]
        assert lease_of(rs) == {"holder": new, "term": term + 1, "began": "switchover"}
        wait_for(lambda: not rs.alive(old), timeout=30, message=f"{old} exited")
        log = Path(rs.server(old).log).read_text(errors="replace")
        assert f"switched over to {new} (term {term + 1})" in log, log[-2000:]
        final = converged(rs, streams, names=[s.name for s in rs.servers if s.name != old])
        verdict(history, final, tmp_path)
        recopies = recopies_of(rs, old)
        rs.restart(old)
        new_url = rs.server(new).url
        wait_for(
            lambda: (st := rs.status(old)) and st["role"] == "standby" and st["primary"] == new_url,
            timeout=60,
            message=lambda: f"{old} following {new}: {rs.statuses()}",
        )
        in_sync(rs, 2)
        assert converged(rs, streams) == final
        assert recopies_of(rs, old) == recopies
        print(
            f"\nSIGTERM to primary {old}: {new} primary (term {term + 1}) after "
            f"{stopped['after']:.2f} s, harness included"
        )
    finally:
        rs.down()
