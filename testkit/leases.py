"""A replica set's Lease (``<name>-leader``) as its servers write it, for the tests that
play the servers: the operator reads it (``stream_operator.decisions.replica_roles``) and adds its
owner reference (``stream_operator.controllers.lease_owner``), the servers write it
(``stream_server.replication.lease.kube_lease``). The annotation names are the contract between
the two, spelled out here as a test would read them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from testkit.cluster import Cluster

TERM = "streams.pyds.dev/term"
IN_SYNC = "streams.pyds.dev/in-sync"
TERM_BEGAN = "streams.pyds.dev/term-began"


def replica_lease(
    name: str,
    namespace: str,
    holder: str,
    term: int = 1,
    in_sync: Sequence[str] = (),
    began: str = "",
) -> dict[str, Any]:
    """The Lease of the replica set ``name``: held by ``holder`` in ``term``, with the
    standbys ``in_sync``; ``began``: how the term began, when the test says."""
    notes = {TERM: str(term), IN_SYNC: json.dumps(list(in_sync))}
    if began:
        notes[TERM_BEGAN] = began
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"{name}-leader",
            "namespace": namespace,
            "annotations": notes,
        },
        "spec": {"holderIdentity": holder},
    }


def write_replica_lease(
    c: Cluster,
    name: str,
    namespace: str,
    holder: str,
    term: int,
    in_sync: Sequence[str],
    began: str = "",
) -> None:
    """Holder, term and in-sync set in one write, as a server's compare-and-swap makes it:
    the Lease created, or changed in place."""
    lease = replica_lease(name, namespace, holder, term, in_sync, began)
    if c.get("Lease", namespace, f"{name}-leader") is None:
        c.create(lease).raise_for_status()
    else:
        body = {"metadata": {"annotations": lease["metadata"]["annotations"]}}
        patch = {**body, "spec": lease["spec"]}
        c.patch("Lease", namespace, f"{name}-leader", patch).raise_for_status()
