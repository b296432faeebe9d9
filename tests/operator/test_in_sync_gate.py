"""The operator's backstop for the in-sync readiness gate (issue 25): which pod conditions
it writes from the Lease. The Lease holder sets them first (stream_server.replication.
pod_labels); the operator writes only where a pod's condition says otherwise."""

from __future__ import annotations

from typing import Any

from stream_operator.render import IN_SYNC
from stream_operator.replica_roles import LeaseView, in_sync_changes


def pod(name: str, in_sync: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if in_sync is not None:
        conditions.append({"type": IN_SYNC, "status": in_sync})
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def test_the_holder_and_the_in_sync_standbys_are_true_the_others_false() -> None:
    view = LeaseView(holder="ds-0", term=3, in_sync=("ds-2",))
    pods = [pod("ds-0"), pod("ds-1"), pod("ds-2")]
    assert in_sync_changes(view, pods, IN_SYNC) == [
        ("ds-0", True),
        ("ds-1", False),
        ("ds-2", True),
    ]


def test_only_what_differs_is_written() -> None:
    view = LeaseView(holder="ds-0", term=3, in_sync=("ds-2",))
    pods = [pod("ds-0", "True"), pod("ds-1", "True"), pod("ds-2", "True")]
    assert in_sync_changes(view, pods, IN_SYNC) == [("ds-1", False)]  # fell out of the set
    pods = [pod("ds-0", "True"), pod("ds-1", "False"), pod("ds-2", "True")]
    assert in_sync_changes(view, pods, IN_SYNC) == []


def test_no_holder_decides_nothing() -> None:
    assert in_sync_changes(LeaseView(), [pod("ds-0"), pod("ds-1", "True")], IN_SYNC) == []
