"""Where the archive ends along a term history, and a put that finds its name taken
(archive/upload/archive_end.py), against a real SeaweedFS, in-process."""

from __future__ import annotations

import time

import pytest

from stream_format.archive import ArchivedFrame, encode_frames_object, wal_name
from stream_format.wal import encode_frame
from stream_server.archive.object_store import ObjectStore
from stream_server.archive.upload import archive_end
from testkit.archive_store import S3Store, object_store

pytestmark = pytest.mark.processes


def frames(first: int, last: int) -> list[ArchivedFrame]:
    now = time.time_ns() // 1000
    return [ArchivedFrame(n, now, encode_frame(n, [])) for n in range(first, last + 1)]


@pytest.fixture
def store(archive_store: S3Store) -> ObjectStore:
    return object_store(archive_store, archive_store.new_bucket() + "/p")


def test_a_taken_name_continues_after_the_object_there(store: ObjectStore) -> None:
    assert store.put_new(wal_name(1, 1), encode_frames_object(1, frames(1, 5)))
    assert archive_end.put_frames(store, 1, frames(1, 3)) == 5  # more there: skip to 6
    assert archive_end.put_frames(store, 1, frames(6, 8)) == 8
    assert store.put_new(wal_name(1, 9), encode_frames_object(1, frames(9, 9)))
    assert archive_end.put_frames(store, 1, frames(9, 12)) == 9  # fewer there: go on at 10


def test_the_end_follows_the_history_not_a_deposed_primary(store: ObjectStore) -> None:
    history = [(1, 1), (2, 5)]
    assert archive_end.archived_end(store, history) == (0, 1)
    # The deposed primary of term 1 archived 1..7; term 2 began at 5.
    store.put_new(wal_name(1, 1), encode_frames_object(1, frames(1, 7)))
    assert archive_end.archived_end(store, history) == (4, 1)
    store.put_new(wal_name(2, 5), encode_frames_object(2, frames(5, 6)))
    assert archive_end.archived_end(store, history) == (6, 2)
    archive_end.put_history(store, history, 2)
    archive_end.put_history(store, history, 2)  # a second writer: no error, no change
    assert b"[[1, 1], [2, 5]]" in store.get("history/" + f"{2:016x}.json")
