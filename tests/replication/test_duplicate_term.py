"""An idempotent producer's duplicate is an acknowledgement like its original, and a
primary names its term in each (docs/replication.md): the duplicate's 204 carried no
``Replication-Term``, so a client checking its acknowledgements' terms could not
tell a retry answered by the primary of the current term from one answered by a
deposed one. The same through a worker, whose answer crosses the link."""

from __future__ import annotations

import httpx
import pytest

from testkit.replica_set_processes import primary_with_standbys, status
from testkit.worker_counts import WORKER_COUNTS

pytestmark = pytest.mark.processes

TEXT = {"content-type": "text/plain"}


@WORKER_COUNTS
def test_a_duplicate_s_acknowledgement_names_the_primary_s_term(start_set, workers: str) -> None:
    (srv,) = start_set(f"dup-term-{workers}", "--workers", workers, count=1)
    primary = primary_with_standbys([srv], 0)
    url = f"{primary.base}s"
    assert httpx.put(url, headers=TEXT).status_code == 201
    producer = {**TEXT, "producer-id": "p", "producer-epoch": "0", "producer-seq": "0"}
    first = httpx.post(url, content=b"once", headers=producer)
    again = httpx.post(url, content=b"once", headers=producer)  # a retry of the same append
    term = str(status(primary)["term"])
    assert first.status_code == 200 and first.headers["replication-term"] == term
    assert again.status_code == 204, again.text
    assert again.headers.get("replication-term") == term, dict(again.headers)
    assert httpx.get(url, params={"offset": "-1"}).content == b"once"  # not appended twice
