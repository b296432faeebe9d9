"""The object store the archive tests run against: SeaweedFS by default, Ceph's RADOS
Gateway with ``ARCHIVE_STORE=ceph`` (``make test-long``). Both have one interface
(``S3Store``): ``endpoint``, ``env()``, ``new_bucket()``, ``stop``, ``start``,
``kill``, ``client()``; ``object_store`` gives the test an ``ObjectStore`` on one of its buckets.

    from testkit.archive_store import object_store   # the fixture: a plugin (conftest.py)

    def test_x(archive_store):
        url = archive_store.new_bucket() + "/prefix"
        objects = object_store(archive_store, url)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol
from unittest import mock

import pytest

if TYPE_CHECKING:  # boto3 is imported by the tests that use a store only
    from stream_server.archive.object_store import ObjectStore

STORES = ("seaweedfs", "ceph")


class S3Store(Protocol):
    """A real S3-compatible store the tests start (``testkit.seaweedfs``, ``testkit.ceph_rgw``)."""

    @property
    def endpoint(self) -> str: ...

    def env(self, **extra: str) -> dict[str, str]: ...

    def new_bucket(self) -> str: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def kill(self) -> None: ...

    def close(self) -> None: ...

    def client(self) -> Any:
        """A boto3 S3 client with the store's keys, for the test's own requests."""
        ...


def which() -> str:
    """The store ``ARCHIVE_STORE`` names (seaweedfs when unset)."""
    name = os.environ.get("ARCHIVE_STORE", "seaweedfs") or "seaweedfs"
    if name not in STORES:
        raise ValueError(f"ARCHIVE_STORE={name!r}: one of {', '.join(STORES)}")
    return name


def make_store(name: str | None = None) -> S3Store:
    """A new, not yet started, store of the kind ``name`` (default: ``which()``)."""
    if (name or which()) == "ceph":
        from testkit.ceph_rgw import CephRGW

        return CephRGW()
    from testkit.seaweedfs import SeaweedFS

    return SeaweedFS()


def object_store(store: S3Store, url: str) -> ObjectStore:
    """An ``ObjectStore`` on ``url`` in ``store``, with its credentials (read by boto3
    from the environment when the client is made, as the server reads them)."""
    from stream_server.archive.object_store import ObjectStore
    from stream_server.declared.groups import ArchiveSettings

    with mock.patch.dict(os.environ, store.env()):
        return ObjectStore(ArchiveSettings(archive_url=url, archive_endpoint=store.endpoint))


def server_args(store: S3Store, url: str) -> list[str]:
    """A server's flags for an archive at ``url`` in ``store``."""
    return ["--archive-url", url, "--archive-endpoint", store.endpoint]


@pytest.fixture(scope="module")
def archive_store() -> Iterator[S3Store]:
    """The module's store (``ARCHIVE_STORE``); each test takes ``new_bucket()``."""
    store = make_store()
    try:
        store.start()
        yield store
    finally:
        store.close()
