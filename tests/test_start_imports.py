"""What a server's start imports: boto3 only when the server has an archive.

Every server process pays its imports at each start (a pod's restart, a failover's new
standby); boto3, with botocore's session and config, was about 0.2 s of 1.4, for a
store most servers do not have. ``archive.object_store`` imports it when a store is made.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.servers import env_with

pytestmark = pytest.mark.processes  # a fresh interpreter: this one has imported everything

PROBE = (
    "import sys\n"
    "import stream_server.server, stream_server.app\n"
    "print(' '.join(m for m in ('boto3', 'botocore.session', 's3transfer') if m in sys.modules))\n"
)


def test_a_server_without_an_archive_does_not_import_boto3():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env_with(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"imported at start: {out.stdout.strip()}"
