"""The official conformance suite (npm) against a real server process.

Passes when every test passes and none is skipped; prints the totals. The
subscription tests (protocol sections 6 and 7) are turned on in
``conformance.test.ts`` (``subscriptions: true``): they run a webhook receiver
on 127.0.0.1, which the server's development exception for webhook URLs allows.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from testkit import needs

HERE = Path(__file__).parent


SUITE = HERE / "node_modules" / "@durable-streams" / "server-conformance-tests"


@needs.commands("npx", install="Debian's nodejs and npm (make system-deps)")
def test_official_conformance_suite(server_factory):
    if not SUITE.exists():  # the test never reaches for the network itself
        needs.missing(f"the conformance suite is not installed in {SUITE.parent.parent}: make deps")
    srv = server_factory("--long-poll-timeout", "1", "--sse-reconnect-interval", "2").start()
    results = HERE / "results.json"
    results.unlink(missing_ok=True)
    env = {**os.environ, "CONFORMANCE_TEST_URL": srv.url, "CONFORMANCE_LONG_POLL_MS": "2000"}
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
        f"conformance: {report['numPassedTests']} passed, {report['numFailedTests']} failed, "
        f"{report['numPendingTests'] + report['numTodoTests']} skipped "
        f"of {report['numTotalTests']}"
    )
    print("\n" + totals)
    assert not failed, totals + "\n" + "\n".join(failed) + "\n" + proc.stdout[-2000:]
    assert report["numFailedTests"] == 0
    assert report["numPendingTests"] + report["numTodoTests"] == 0, totals
    assert report["numPassedTests"] >= 338, totals
