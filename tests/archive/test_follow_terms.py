"""A replica cluster's server follows the source's term histories (docs/replica-clusters.md):
after a failover at the source it takes the new term's frames from that term's first
lsn, skipping a deposed primary's frames of the old term at and past it; a follower
that already applied such a frame stops, says why, and keeps serving what it had.

The archive is made by hand from a real source's WAL frames (``testkit.archive_frames``):
frames 1..K-1 under term 0, a deposed primary's frame K under term 0, and the source's
frames K..N under term 1 with the history ``[[0, 1], [1, K]]``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_format import wal as walmod
from stream_format.archive import ArchivedFrame
from stream_format.meta import DB_INFO
from stream_server.archive.upload import archive_end
from testkit import wait_for
from testkit.archive_follow import append, caught_up, create, follower, read, source
from testkit.archive_frames import wal_frames
from testkit.archive_store import S3Store, object_store

pytestmark = pytest.mark.processes


def deposed(lsn: int) -> ArchivedFrame:
    """A frame of lsn ``lsn`` the source's history does not hold (a deposed primary's)."""
    frame = walmod.encode_frame(lsn, [(walmod.PUT, DB_INFO, b"deposed", b"1")])
    return ArchivedFrame(lsn, time.time_ns() // 1000, frame)


def test_follower_takes_the_new_terms_frames_after_a_failover(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    objects = object_store(archive_store, archive_store.new_bucket())
    src = source(server_factory, tmp_path)
    create(src, "s", b"0 ")
    for i in range(1, 6):
        append(src, "s", b"%d " % i)
    frames = wal_frames(src.data_dir / "wal")
    k = len(frames) - 2  # term 1 begins at frame K
    archive_end.put_history(objects, [(0, 1)], 0)
    archive_end.put_frames(objects, 0, frames[: k - 1])
    fol = follower(server_factory, tmp_path, archive_store, objects.url)
    wait_for(lambda: read(fol, "s")[0] == 200, message=lambda: fol.log()[-2000:])
    # The failover: the new primary's history first (it writes it before its
    # frames), then a deposed primary's frame K lands beside the new term's.
    archive_end.put_history(objects, [(0, 1), (1, k)], 1)
    archive_end.put_frames(objects, 0, [deposed(k)])
    archive_end.put_frames(objects, 1, frames[k - 1 :])
    caught_up(src, fol, ["s"])
    append(src, "s", b"after")  # the new term goes on
    archive_end.put_frames(objects, 1, wal_frames(src.data_dir / "wal")[len(frames) :])
    caught_up(src, fol, ["s"])


def test_follower_that_applied_a_deposed_frame_stops_and_says_so(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    objects = object_store(archive_store, archive_store.new_bucket())
    src = source(server_factory, tmp_path)
    create(src, "s", b"0 ")
    append(src, "s", b"1 ")
    frames = wal_frames(src.data_dir / "wal")
    k = len(frames) + 1
    archive_end.put_history(objects, [(0, 1)], 0)
    archive_end.put_frames(objects, 0, [*frames, deposed(k)])
    fol = follower(server_factory, tmp_path, archive_store, objects.url)
    wait_for(lambda: "following" in fol.log() and read(fol, "s")[1] == b"0 1 ")
    append(src, "s", b"2 ")
    archive_end.put_history(objects, [(0, 1), (1, k)], 1)
    archive_end.put_frames(objects, 1, wal_frames(src.data_dir / "wal")[len(frames) :])
    wait_for(
        lambda: "must be rebuilt from a base backup" in fol.log(),
        message=lambda: fol.log()[-2000:],
    )
    assert read(fol, "s")[:2] == (200, b"0 1 ")  # it serves what it had
    # ... and says it is stuck: not ready (the reason in the body), failing, its lag
    # growing (it applies nothing more), and its series tell the alert so.
    ready = httpx.get(f"{fol.url}/readyz", timeout=5)
    assert ready.status_code == 503, ready.text
    assert any("must be rebuilt" in p for p in ready.json()["problems"]), ready.text
    first = _status(fol)
    assert first["failing"] is True and first["lag_seconds"] > 0, first
    wait_for(lambda: _status(fol)["lag_seconds"] > first["lag_seconds"])
    metrics = httpx.get(f"{fol.url}/metrics", timeout=5).text
    assert "durable_streams_archive_follow_failing 1.0" in metrics, metrics
    lag = re.search(r"^durable_streams_archive_follow_lag_seconds (\S+)$", metrics, re.M)
    assert lag is not None and float(lag.group(1)) > 0, metrics


def _status(srv: Any) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{srv.url}/_archive/status", timeout=5).json()
    return doc
