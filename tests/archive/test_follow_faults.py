"""A replica cluster's server when things go wrong (docs/replica-clusters.md): the object
store down for a while (reads go on from what it has, and it catches up once the store
is back), and data directories it must not follow from (a single node's own data,
another archive's frames), refused at the start with a message saying why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testkit.archive_follow import (
    append,
    caught_up,
    create,
    follow_args,
    follower,
    read,
    refused_start,
    source,
)
from testkit.archive_frames import upload_wal
from testkit.archive_store import S3Store, object_store

pytestmark = pytest.mark.processes


def test_follower_rides_out_the_store_being_down(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    objects = object_store(archive_store, archive_store.new_bucket())
    src = source(server_factory, tmp_path)
    create(src, "s", b"before ")
    upload_wal(src.data_dir, objects)
    fol = follower(server_factory, tmp_path, archive_store, objects.url)
    caught_up(src, fol, ["s"])
    archive_store.kill()
    try:
        append(src, "s", b"while down ")
        assert read(fol, "s")[:2] == (200, b"before ")  # reads go on
    finally:
        archive_store.start()
    upload_wal(src.data_dir, objects)
    append(src, "s", b"after")
    upload_wal(src.data_dir, objects)
    # A request the follower sent as the store came back may wait out boto3's read
    # timeout (30 s) before the next poll: the deadline allows for two of them.
    caught_up(src, fol, ["s"], timeout=90)


def test_a_directory_of_other_data_is_not_followed(
    server_factory: Any, tmp_path: Path, archive_store: S3Store
) -> None:
    first = object_store(archive_store, archive_store.new_bucket())
    second = archive_store.new_bucket()
    src = source(server_factory, tmp_path)
    create(src, "s", b"x")
    upload_wal(src.data_dir, first)
    fol = follower(server_factory, tmp_path, archive_store, first.url)
    caught_up(src, fol, ["s"])
    fol.stop()
    src.stop()  # each directory is started again below, by a refused start
    out = refused_start(src.data_dir, archive_store, *follow_args(archive_store, first.url))
    assert "holds data that is not the archive's" in out
    out = refused_start(fol.data_dir, archive_store, *follow_args(archive_store, second))
    assert f"follows the archive {first.url}, not {second}" in out
