"""The RBAC the operator is installed with (manifests/rbac.yaml), checked against every
request it made of the emulated API server: a test's operator run fails when it
needed a right the manifest does not grant.

Shared by the kopf tests that end with that check (test_kopf_emulated.py,
test_monitoring_kopf.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from testkit import rbac
from testkit.cluster import Cluster

RBAC = Path(__file__).resolve().parents[1] / "manifests" / "rbac.yaml"


def assert_role_grants_what_the_operator_did(c: Cluster) -> None:
    """The RBAC the chart installs grants every request the operator made."""
    granted = rbac.grants(
        yaml.safe_load_all(RBAC.read_text()), "durable-streams", "durable-streams"
    )
    calls = [call for call in c.api.requests if not call.agent.startswith("python-httpx/")]
    missing = rbac.denied(calls, granted)
    assert not missing, f"the operator's RBAC does not grant {missing}"
