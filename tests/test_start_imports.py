"""What a server's start imports: what its mode and settings use, not every mode's code.

Every server process pays its imports at each start (a pod's restart, a failover's new
standby, every server a test starts). boto3, with botocore's session and config, was
about 0.2 s of 1.4 s, for a store most servers do not have: ``archive.object_store``
imports it when a store is made. A replica set's member (its Lease client, the HTTP
client, peer TLS) was another 0.26 CPU s of each single node's start:
``node/modes.py`` imports a mode's module only for a node in that mode.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testkit.servers import env_with

pytestmark = pytest.mark.processes  # a fresh interpreter: this one has imported everything

# Modules a single node without an archive has no use for, one per heavy thing.
NOT_NEEDED = (
    "boto3",
    "botocore.session",
    "s3transfer",
    "stream_server.replication.replica_set",
    "stream_server.replication.lease.kube_lease",
    "stream_server.archive.follow.replica_cluster",
)

PROBE = """
import sys
from pathlib import Path
from stream_server.app import StreamServerApp
from stream_server.config import Settings
import stream_server.server

StreamServerApp(Settings(data_dir=Path(sys.argv[1])))
print(' '.join(m for m in sys.argv[2:] if m in sys.modules))
"""


def imported_by_a_single_nodes_start(data_dir: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(data_dir), *NOT_NEEDED],
        env=env_with(),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def test_a_single_node_without_an_archive_imports_neither_boto3_nor_the_replica_set(tmp_path):
    assert imported_by_a_single_nodes_start(tmp_path / "data") == []
