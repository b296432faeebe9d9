"""A node is a Topology and its Parts (``stream_server/node/``): each mode answers the
same routes, paths ahead of Starlette and write refusals as the app did when it
branched on the mode. The real app, built and not started (no socket, no Lease)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_server.app import StreamServerApp
from stream_server.config import Settings
from stream_server.node.archive_follower_node import ArchiveFollowerNode
from stream_server.node.archive_part import ArchivePart
from stream_server.node.replica_set_member import ReplicaSetMember
from stream_server.node.topology import SingleNode

ARCHIVE = {"archive_url": "s3://bucket/prefix", "archive_endpoint": "http://127.0.0.1:1"}
SET = {
    "replication_lease": "default/node",
    "replica_name": "r0",
    "replica_url": "http://127.0.0.1:1",
    "kube_api": "http://127.0.0.1:1",
}
ALWAYS = {
    ("/healthz", "GET"),
    ("/readyz", "GET"),
    ("/_archive/status", "GET"),
    ("/_archive/backups", "GET"),
    ("/_archive/backups", "POST"),
    ("/metrics", "GET"),
}
REPLICATION = {
    ("/replication", "GET"),
    ("/replication/snapshot", "GET"),
    ("/replication/switchover", "POST"),
}


def routes(app: StreamServerApp) -> set[tuple[str, str]]:
    return {
        (route.path, method)
        for route in app.web.routes
        for method in getattr(route, "methods", ()) or ()
        if method != "HEAD"
    }


@pytest.mark.parametrize(
    ("extra", "kind", "expected", "ahead"),
    [
        ({}, SingleNode, ALWAYS, set()),
        ({"metrics": False}, SingleNode, ALWAYS - {("/metrics", "GET")}, set()),
        (ARCHIVE, SingleNode, ALWAYS, set()),
        (
            SET,
            ReplicaSetMember,
            ALWAYS | REPLICATION,
            {"/replication/stream"},
        ),
        ({**ARCHIVE, "archive_follow": True}, ArchiveFollowerNode, ALWAYS, set()),
    ],
)
def test_each_mode_serves_the_same_routes(tmp_path: Path, extra, kind, expected, ahead):
    app = StreamServerApp(Settings(data_dir=tmp_path / "data", **extra))
    assert app.kind is kind and isinstance(app.topology, kind)
    assert routes(app) == expected
    assert set(app.ahead) == ahead


def test_only_a_node_that_archives_its_own_wal_has_the_archive_part(tmp_path: Path):
    single = StreamServerApp(Settings(data_dir=tmp_path / "a", **ARCHIVE))
    assert single.part(ArchivePart) is not None and single.refuses_writes
    follower = StreamServerApp(Settings(data_dir=tmp_path / "b", archive_follow=True, **ARCHIVE))
    assert follower.part(ArchivePart) is None and follower.follower is not None
    assert follower.refuses_writes  # a replica cluster's server refuses every write
    plain = StreamServerApp(Settings(data_dir=tmp_path / "c"))
    assert plain.part(ArchivePart) is None and not plain.refuses_writes
