"""A replica set's Lease (``<name>-leader``) made a dependent of its DurableStream.

The servers create the Lease (the operator never renders it: its holder, term and
in-sync set change by their compare-and-swap), so nothing else would delete it with
the DurableStream: a DurableStream made again under the same name after
``pvcRetention: Delete`` would find the old set's Lease, naming a set id and terms its
empty volumes do not hold, and might never elect. Once the Lease exists, each round
adds an owner reference to the DurableStream (not as controller: the operator does not
write the Lease otherwise), and the garbage collector deletes the Lease with its owner.
The servers write every metadata field they do not own back as they read it
(``stream_server.replication.lease.kube_lease``), so their renewals keep the reference.

The patch names the resourceVersion it read: a server's write in between makes it a
409, and the next round tries again on the Lease as it is then. The reference blocks
its owner's deletion as every rendered object's does: under the
OwnerReferencesPermissionEnforcement admission plugin that asks ``update`` on the
DurableStream's finalizers, and the change of owner references ``delete`` on the Lease,
both granted to the operator.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator.kube import leadership
from stream_operator.kube.apply import MERGE_PATCH
from stream_operator.specs.render import lease_name, owner_reference

log = logging.getLogger(__name__)


def lease_reference(ds: dict[str, Any]) -> dict[str, Any]:
    """The owner reference the Lease gets: the DurableStream, not as its controller."""
    meta = ds["metadata"]
    return {**owner_reference(meta["name"], meta["uid"]), "controller": False}


def adoption(lease: dict[str, Any] | None, ds: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that adds the reference to ``lease`` as read (None: no Lease yet,
    or it names this DurableStream already): every owner it has kept, at the version
    read."""
    if lease is None:
        return None
    meta = lease.get("metadata") or {}
    refs = list(meta.get("ownerReferences") or [])
    if any(ref.get("uid") == ds["metadata"]["uid"] for ref in refs):
        return None
    return {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "ownerReferences": [*refs, lease_reference(ds)],
        }
    }


def adopt_lease(
    ac: client.ApiClient, ds: dict[str, Any], lease: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Add the owner reference to the replica set's Lease if it lacks it; the Lease as it
    is now (as read when nothing was written, None when it is gone)."""
    patch = adoption(lease, ds)
    if patch is None or not leadership.may_act():
        return lease
    namespace, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
    try:
        written = client.CoordinationV1Api(ac).patch_namespaced_lease(
            lease_name(name), namespace, patch, _content_type=MERGE_PATCH
        )
    except ApiException as exc:
        if exc.status == 404:
            return None  # gone since it was read (a scale-down to one replica)
        if exc.status == 409:
            return lease  # a server wrote it in between: the next round tries again
        raise
    log.info("the Lease %s/%s names its DurableStream as owner", namespace, lease_name(name))
    plain: dict[str, Any] = ac.sanitize_for_serialization(written)  # type: ignore[no-untyped-call]
    return plain
