"""A standby's disk fills under load (issue 24).

The standby's data directory is a small tmpfs (``testkit.faults.disk``), taken
almost whole by a filler file; large appends then fill the rest. Its storage
fails closed: it must leave the in-sync set without the primary losing or
refusing acknowledged writes (the primary and the other standby are a
majority), must not serve a read as up to date past the staleness bound while
it holds nothing new, and once space returns and it is restarted it catches up
with identical bytes. Real processes and a real filesystem; needs root.
"""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest

from testkit.faults.disk import fill, free, small_disk
from testkit.history import History
from tests.replication.faultload import BOUND, ROUNDS, loopback_set, monitor, under_load, verdict
from tests.replication.workload import (
    OCTET,
    Workload,
    converged,
    create_streams,
    in_sync,
    until,
)

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a filesystem needs root"),
]

STREAMS = 3
SMALL = "ds-2"  # started last: a standby
# Seconds it stays full once out of the in-sync set, the readers reading it: past the bound.
FULL_FOR = BOUND + 2.0
FILLER = "disk/filler"
BIG = 64 * 1024  # bytes per filling append


def test_a_standby_whose_disk_fills_leaves_the_set_and_rejoins(tmp_path):
    with (
        small_disk(tmp_path / "rs" / SMALL, size_mb=24) as disk,
        loopback_set(tmp_path) as (rs, _),
    ):
        streams = [f"disk/{i}" for i in range(STREAMS)]
        create_streams(rs, [*streams, FILLER])
        history = History()
        work = Workload(rs, history, streams, readers=2)
        refused: list[str] = []
        with monitor(rs, history):
            for _ in range(ROUNDS):
                primary = in_sync(rs, 2)
                if primary == SMALL:  # the small disk is a standby's
                    assert rs.switchover(timeout=30).status_code == 200
                    primary = in_sync(rs, 2)

                def fill_up(primary: str = primary) -> None:
                    fill(disk, leave=1024 * 1024)
                    url = f"{rs.server(primary).base}{FILLER}"
                    with httpx.Client(timeout=30) as client:

                        def out() -> bool:
                            body = uuid.uuid4().hex.encode() * (BIG // 32)
                            client.post(url, content=body, headers=OCTET)
                            return SMALL not in (rs.status(primary) or {}).get("in_sync", [])

                        until(out, f"{SMALL} out of the in-sync set once its disk is full")
                    time.sleep(FULL_FOR)  # the fault: a full standby among the readers
                    free(disk)
                    rs.kill(SMALL)  # its storage failed closed: a restart brings it back
                    rs.restart(SMALL)

                under_load(work, fill_up, refused)
                in_sync(rs, 2)
                if refused:
                    break
            final = converged(rs, [*streams, FILLER])  # the filler stream too
        del final[FILLER]  # not messages: the history checks do not read it
        verdict("full standby disk", history, final, tmp_path, refused=refused)
