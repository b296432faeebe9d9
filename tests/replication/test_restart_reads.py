"""A standby restarted in a healthy set serves reads again a heartbeat or so after it
is up: what it held when it stopped is confirmed by its primary's first message
(docs/replication.md, "Reads", "Only what a quorum confirmed"). Real server processes
on the emulated API server. The time printed is a measurement, not a requirement;
the wait is a liveness bound.
"""

from __future__ import annotations

import time

import httpx
import pytest

from testkit.replica_set_processes import STEADY, primary_with_standbys, status, until

pytestmark = pytest.mark.processes

OCTET = {"content-type": "application/octet-stream"}
APPENDS = 5


def test_a_restarted_standby_is_refused_only_until_its_primary_confirms_what_it_holds(
    start_set,
) -> None:
    servers = start_set("restart-reads", timings=STEADY)
    primary = primary_with_standbys(servers, 2)
    url = f"{primary.base}r/0"
    assert httpx.put(url, headers=OCTET, timeout=10).status_code == 201
    for i in range(APPENDS):
        assert httpx.post(url, content=b"%d;" % i, headers=OCTET, timeout=30).status_code == 204
    whole = b"".join(b"%d;" % i for i in range(APPENDS))
    standby = next(s for s in servers if s is not primary)
    until(
        "the standby serves all", lambda: httpx.get(f"{standby.base}r/0?offset=-1").content == whole
    )
    standby.stop()
    standby.start()
    up = time.monotonic()
    refused: list[str] = []

    def served() -> bool:
        r = httpx.get(f"{standby.base}r/0", params={"offset": "-1"}, timeout=10)
        if r.status_code == 503:
            refused.append(r.json()["error"]["code"])
            return False
        assert r.status_code == 200 and r.content == whole, (r.status_code, r.content)
        return True

    until("the restarted standby serves reads", served)
    took = time.monotonic() - up
    print(
        f"\nrestarted standby: reads served {took:.2f} s after it was ready, {len(refused)} refused"
    )
    assert set(refused) <= {"STALE_REPLICA"}
    assert status(standby)["role"] == "standby"
