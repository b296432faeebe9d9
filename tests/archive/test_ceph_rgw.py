"""What the archive asks of an object store, asked of a real one: Ceph's RADOS Gateway
under ``make test-long`` (``ARCHIVE_STORE=ceph``, ``testkit/ceph_rgw.py``), SeaweedFS
in ``make test`` (the same test, so that both stores are held to one contract).

``ObjectStore``'s operations: a conditional put refused on an existing name (the
archive's only protection against two archivers), ranged and whole gets, sizes,
listings after a name across pages, deletes, the errors sorted by what a caller
does (missing, denied); and objects kept across a clean restart and a kill -9 of the
store.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest

from stream_server.archive.object_store import (
    ArchiveDenied,
    ArchiveMissing,
    ObjectStore,
)
from stream_server.declared.groups import ArchiveSettings
from testkit.archive_store import S3Store, object_store

pytestmark = pytest.mark.processes


def test_the_archives_operations(archive_store: S3Store) -> None:
    objects = object_store(archive_store, archive_store.new_bucket() + "/p")
    assert objects.put_new("wal/a", b"first")
    assert not objects.put_new("wal/a", b"second")  # never replaced
    assert objects.get("wal/a") == b"first"
    body = bytes(range(256)) * 64
    assert objects.put_new("wal/b", body)
    assert objects.get_range("wal/b", 1000, 24) == body[1000:1024]
    assert objects.get_range("wal/b", len(body) - 10, 100) == body[-10:]  # fewer at its end
    assert objects.size("wal/b") == len(body)

    names = [f"wal/n{i:04d}" for i in range(1005)]  # more than a page of 1000
    client = archive_store.client()
    for name in names:
        client.put_object(Bucket=objects.location.bucket, Key="p/" + name, Body=b"x")
    listed = [n for n, _ in objects.objects("wal/n")]
    assert listed == names
    assert [n for n, _ in objects.objects("wal/", start_after="wal/n1000")] == names[1001:]
    assert [n for n, size in objects.objects("wal/") if n in ("wal/a", "wal/b")] == [
        "wal/a",
        "wal/b",
    ]

    objects.delete(["wal/a", *names, "wal/never-there"])
    assert [n for n, _ in objects.objects("")] == ["wal/b"]
    with pytest.raises(ArchiveMissing):
        objects.get("wal/a")


def test_wrong_credentials_are_denied(archive_store: S3Store) -> None:
    url = archive_store.new_bucket()
    env = archive_store.env(AWS_SECRET_ACCESS_KEY="not-the-secret")
    with mock.patch.dict(os.environ, env):
        wrong = ObjectStore(
            ArchiveSettings(archive_url=url, archive_endpoint=archive_store.endpoint)
        )
    with pytest.raises(ArchiveDenied):
        wrong.put_new("wal/x", b"x")


def test_objects_survive_a_restart_and_a_kill(archive_store: S3Store) -> None:
    objects = object_store(archive_store, archive_store.new_bucket())
    assert objects.put_new("kept/1", b"one")
    archive_store.stop()
    archive_store.start()
    assert objects.put_new("kept/2", b"two")
    archive_store.kill()
    archive_store.start()
    assert objects.get("kept/1") == b"one"
    assert objects.get("kept/2") == b"two"
    assert not objects.put_new("kept/1", b"again")
