"""The RBAC the operator is installed with, checked against every request it made of
the emulated API server: a test's operator run fails when it needed a right the
chart does not grant.

The kopf tests run the operator over every namespace, so it is the chart's
``operator.clusterWide`` RBAC (the same rules as the namespaced default's Role, in a
ClusterRole: manifests/cluster-wide/rbac.yaml); manifests/rbac.yaml is the namespaced default (tests/operator/test_rbac.py).

Shared by the kopf tests that end with that check (``operated_cluster``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from testkit import rbac
from testkit.cluster import Cluster, cluster
from testkit.operator import running_operator

RBAC = Path(__file__).resolve().parents[1] / "manifests" / "cluster-wide" / "rbac.yaml"


def cluster_wide_rbac() -> list[dict[str, Any]]:
    """The chart's RBAC with ``operator.clusterWide=true`` (scripts/gen_manifests.py)."""
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def assert_role_grants_what_the_operator_did(c: Cluster) -> None:
    """The RBAC the chart installs grants every request the operator made."""
    granted = rbac.grants(cluster_wide_rbac(), "durable-streams", "durable-streams")
    calls = [call for call in c.api.requests if not call.agent.startswith("python-httpx/")]
    missing = rbac.denied(calls, granted)
    assert not missing, f"the operator's RBAC does not grant {missing}"


@contextlib.contextmanager
def operated_cluster() -> Iterator[Cluster]:
    """An emulated cluster with the operator running in it; once the operator has
    stopped, its RBAC is checked against every request it made."""
    with cluster() as c:
        with running_operator(c):
            yield c
        assert_role_grants_what_the_operator_did(c)
