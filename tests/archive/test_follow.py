"""A replica cluster's server (``--archive-follow``) following a source's archive, real
processes and a real object store (``ARCHIVE_STORE``): it serves the source's bytes,
continues after a restart, wakes its long-polls, refuses every write with 503, and a
restart without ``--archive-follow`` (the promotion) makes it a writable single node
that keeps everything, writes its frames after every frame it applied, under a term
above the source's, and refuses to archive where the source does
(docs/replica-clusters.md). The first two run on a follower of one process and on one
of two workers.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_server.archive.follow_position import single_node_term
from stream_server.engine import Engine
from testkit import wait_for
from testkit.archive_follow import (
    OCTET,
    append,
    caught_up,
    create,
    follow_args,
    follower,
    read,
    refused_start,
    source,
)
from testkit.archive_frames import upload_wal, wal_frames
from testkit.archive_store import S3Store, object_store, server_args
from testkit.server_process import live_gauge
from testkit.worker_counts import WORKER_COUNTS

pytestmark = pytest.mark.processes

PATHS = ["a", "b/c"]


# The follower one process, or a writer and two workers, whose workers serve its reads
# and relay its writes to the writer, which refuses them (workers/worker_app.py).
@WORKER_COUNTS
def test_follower_serves_the_source_and_continues_after_a_restart(
    server_factory: Any, tmp_path: Path, archive_store: S3Store, workers: str
) -> None:
    url = archive_store.new_bucket() + "/source"
    objects = object_store(archive_store, url)
    src = source(server_factory, tmp_path)
    create(src, "a", b"first ")
    create(src, "b/c")
    for i in range(5):
        append(src, "a", b"more %d " % i)
        append(src, "b/c", b"x" * (1000 + i))
    first = upload_wal(src.data_dir, objects)
    fol = follower(server_factory, tmp_path, archive_store, url, args=("--workers", workers))
    caught_up(src, fol, PATHS)
    fol.stop()  # a clean stop empties its WAL: it must resume from what it recorded
    for i in range(3):
        append(src, "a", b"later %d " % i)
    create(src, "d", b"new stream")
    upload_wal(src.data_dir, objects)
    fol.start()
    caught_up(src, fol, [*PATHS, "d"])
    # It applied only the frames it lacked (its WAL holds what it applied since).
    assert wal_frames(fol.data_dir / "wal")[0].lsn == first + 1


@WORKER_COUNTS
def test_follower_refuses_writes_and_wakes_long_polls(
    server_factory: Any, tmp_path: Path, archive_store: S3Store, workers: str
) -> None:
    url = archive_store.new_bucket()
    objects = object_store(archive_store, url)
    src = source(server_factory, tmp_path)
    create(src, "a", b"one ")
    upload_wal(src.data_dir, objects)
    fol = follower(server_factory, tmp_path, archive_store, url, args=("--workers", workers))
    caught_up(src, fol, ["a"])
    for method, path in (("PUT", "new"), ("POST", "a"), ("DELETE", "a")):
        r = httpx.request(method, f"{fol.base}{path}", content=b"x", headers=OCTET)
        assert r.status_code == 503, (method, r.status_code, r.text)
        assert "read-only replica cluster" in r.text, r.text
    assert read(fol, "a")[:2] == (200, b"one ")  # nothing changed
    assert read(fol, "new")[0] == 404

    offset = read(fol, "a")[2]
    got: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            httpx.get(f"{fol.base}a", params={"offset": offset, "live": "long-poll"}, timeout=60)
        )
    )
    waiter.start()
    wait_for(lambda: live_gauge(fol, "long-poll") == 1, message="the long-poll waits")
    append(src, "a", b"two")
    upload_wal(src.data_dir, objects)
    waiter.join(timeout=60)
    assert got and got[0].status_code == 200, got
    assert got[0].content == b"two"


def test_promotion_keeps_everything_and_writes_above_the_source(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    url = archive_store.new_bucket()
    objects = object_store(archive_store, url)
    src = source(server_factory, tmp_path)
    create(src, "a", b"kept ")
    for i in range(4):
        append(src, "a", b"%d " % i)
    last = upload_wal(src.data_dir, objects)
    fol = follower(server_factory, tmp_path, archive_store, url)
    caught_up(src, fol, ["a"])
    before = read(fol, "a")[1]
    src.stop()
    fol.stop()  # its directory is started again below, promoted

    # Promoted to archive where its source does: refused, and nothing written.
    out = refused_start(tmp_path / "follower", archive_store, *server_args(archive_store, url))
    assert "must not archive where its source does" in out

    promoted = fol
    promoted.args = []  # no --archive-follow, no archive
    promoted.start()
    try:
        assert read(promoted, "a")[:2] == (200, before)
        append(promoted, "a", b"after")
        create(promoted, "z", b"new")
        assert read(promoted, "a")[1] == before + b"after"
        assert read(promoted, "z")[1] == b"new"
        frames = wal_frames(promoted.data_dir / "wal")
        assert frames[0].lsn > last, [f.lsn for f in frames]  # after every frame applied
    finally:
        promoted.stop()
    # Once promoted, it never follows an archive again.
    out = refused_start(tmp_path / "follower", archive_store, *follow_args(archive_store, url))
    assert "was promoted" in out
    engine = Engine(tmp_path / "follower")
    engine.open()
    try:
        assert single_node_term(engine) == (1, [(0, 1), (1, last + 1)])
    finally:
        engine.close()
