"""The official conformance suite (npm) against a real server process.

Passes when every test passes and none is skipped; prints the totals. It runs
three times: against a single server, against one with two worker processes
(``--workers 2``), and through the primary of a 3-replica set. The
subscription tests (protocol sections 6 and 7) are turned on in
``conformance.test.ts`` (``subscriptions: true``): they run a webhook receiver
on 127.0.0.1, which the server's development exception for webhook URLs allows.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from testkit import needs, summary, wait_for
from testkit.replicaset import ReplicaSet

pytestmark = pytest.mark.processes

HERE = Path(__file__).parent


SUITE = HERE / "node_modules" / "@durable-streams" / "server-conformance-tests"
TIMINGS = ("--long-poll-timeout", "1", "--sse-reconnect-interval", "2")
# Short leases, and standbys given 10 s before a write is refused (a loaded machine).
REPLICATION_TIMINGS = {
    "lease_duration": "3",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.3",
    "replication_wait": "10",
}


def _run_suite(url: str, label: str) -> None:
    """Run the npm suite against ``url``; fail with the failed tests' names and messages."""
    results = HERE / "results.json"
    results.unlink(missing_ok=True)
    env = {**os.environ, "CONFORMANCE_TEST_URL": url, "CONFORMANCE_LONG_POLL_MS": "2000"}
    proc = subprocess.run(
        ["npx", "vitest", "run"], cwd=HERE, env=env, capture_output=True, text=True, timeout=600
    )
    report = json.loads(results.read_text())
    failed = [
        " > ".join([*t["ancestorTitles"], t["title"]])
        + "\n    "
        + (t["failureMessages"] or [""])[0][:300]
        for f in report["testResults"]
        for t in f["assertionResults"]
        if t["status"] == "failed"
    ]
    totals = (
        f"conformance ({label}): {report['numPassedTests']} passed, "
        f"{report['numFailedTests']} failed, "
        f"{report['numPendingTests'] + report['numTodoTests']} skipped "
        f"of {report['numTotalTests']}"
    )
    summary.report("figures", totals)
    assert not failed, totals + "\n" + "\n".join(failed) + "\n" + proc.stdout[-2000:]
    assert report["numFailedTests"] == 0
    assert report["numPendingTests"] + report["numTodoTests"] == 0, totals
    assert report["numPassedTests"] >= 338, totals


def _need_suite() -> None:
    if not SUITE.exists():  # the test never reaches for the network itself
        needs.missing(f"the conformance suite is not installed in {SUITE.parent.parent}: make deps")


@needs.commands("npx", install="Debian's nodejs and npm (make system-deps)")
def test_official_conformance_suite(server_factory):
    _need_suite()
    srv = server_factory(*TIMINGS).start()
    _run_suite(srv.url, "single node")


@needs.commands("npx", install="Debian's nodejs and npm (make system-deps)")
def test_official_conformance_suite_through_two_workers(server_factory):
    """The same suite on ``--workers 2``: every request parsed by a worker process, the
    store's work done by the writer (subscriptions' paths relayed to it)."""
    _need_suite()
    srv = server_factory(*TIMINGS, "--workers", "2").start()
    _run_suite(srv.url, "single node, 2 worker processes")


@needs.commands("npx", install="Debian's nodejs and npm (make system-deps)")
def test_official_conformance_suite_through_a_replica_sets_primary(tmp_path: Path):
    """The same suite through the primary of a 3-replica set: every write waits for a
    standby, reads come from the primary, subscriptions are delivered by it alone. After
    the suite, the standbys hold what the primary holds (checked on one busy stream)."""
    _need_suite()
    rs = ReplicaSet.up(3, tmp_path / "rs", args=TIMINGS, settings=REPLICATION_TIMINGS)
    try:
        primary = rs.primary()
        _run_suite(primary.url, "3-replica set, through the primary")
        _check_copies(rs, primary.name)
    finally:
        rs.down()


def _check_copies(rs: ReplicaSet, primary: str) -> None:
    """One more stream written through the primary reads the same on every in-sync replica."""
    url = f"{rs.server(primary).url}/v1/stream/after-conformance"
    text = {"Content-Type": "text/plain"}
    assert httpx.put(url, headers=text).status_code == 201
    for i in range(20):
        assert httpx.post(url, content=f"line {i}\n".encode(), headers=text).is_success
    want = httpx.get(url, params={"offset": "-1"}).content
    in_sync = rs.status(primary)["in_sync"]  # type: ignore[index]
    assert in_sync, "no standby in sync after the suite"
    for name in in_sync:
        got = wait_for(
            lambda name=name: (
                (
                    r := httpx.get(
                        f"{rs.server(name).url}/v1/stream/after-conformance",
                        params={"offset": "-1"},
                    )
                ).status_code
                == 200
                and r.content == want
                and r
            ),
            timeout=30,
            message=f"{name} to serve what the primary holds",
        )
        assert got.content == want
