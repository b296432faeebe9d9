"""A ServiceMonitor as operators before the PodMonitor made it, for the tests that check
that this operator prunes it (test_rbac.py, test_monitoring_kopf.py).
"""

from __future__ import annotations

from typing import Any

from stream_operator import KIND


def older_servicemonitor(owner: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A ServiceMonitor as operators before the PodMonitor made it: owned and labelled
    as the operator's, so that this one prunes it."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": "events",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "durable-streams",
                "app.kubernetes.io/instance": "events",
                "app.kubernetes.io/managed-by": "durable-streams-operator",
            },
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": KIND,
                    "name": "events",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/instance": "events"}}},
    }
