"""Fixtures the end-to-end operator tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_operator import replica_set
from testkit.cluster import Cluster
from testkit.kube_serve import api_server_process
from testkit.operator import running_operator


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Cluster]:
    """The emulated API server as its own process, with the real kopf operator on it."""
    try:
        with api_server_process(tmp_path) as c, running_operator(c):
            yield c
    finally:
        replica_set.use_pod_urls(None)  # back to cluster DNS names for the other tests
