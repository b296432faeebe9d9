"""Issue 42: the servers' Lease writes keep the metadata they do not own.

The operator adds an owner reference to the DurableStream to the Lease
(``stream_operator.controllers.lease_owner``), so that the garbage collector deletes the Lease
with it. Every server write is a PUT of an object the server builds; it used to
carry only the server's own annotations, so the first renewal dropped the
reference, and, under the OwnerReferencesPermissionEnforcement admission plugin,
asked ``delete`` on the Lease for that change, which the servers' Role does not
grant. Now renewals, elections and in-sync changes write back as read the owner
references, labels, finalizers and the annotations outside ``streams.pyds.dev/``.
"""

from __future__ import annotations

from typing import Any

from stream_operator.specs.render import owner_reference
from stream_server.replication.lease.kube_lease import TERM, LeaseRecord
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from tests.replication.role_loops import DURATION, Clock, replica

KEPT = {
    "labels": {"team": "streams"},
    "annotations": {"example.com/note": "kept"},
    "finalizers": ["example.com/hold"],
}


def lease_meta(api: Cluster, lease: str) -> dict[str, Any]:
    ns, name = lease.split("/")
    return dict((api.get("Lease", ns, name) or {}).get("metadata") or {})


def kept(meta: dict[str, Any]) -> dict[str, Any]:
    notes = {k: v for k, v in (meta.get("annotations") or {}).items() if k in KEPT["annotations"]}
    return {
        "ownerReferences": meta.get("ownerReferences"),
        "labels": meta.get("labels"),
        "annotations": notes,
        "finalizers": meta.get("finalizers"),
    }


def admission_checks(api: Cluster, start: int) -> list[tuple[str, str]]:
    """The admission plugin's checks on an owner-reference change, since ``start``."""
    return [
        (call.verb, call.resource)
        for call in api.api.requests[start:]
        if call.verb == "delete" or call.resource.endswith("/finalizers")
    ]


async def test_renewals_elections_and_in_sync_changes_keep_the_operators_metadata(
    api, lease
) -> None:
    clock = Clock()
    a, b = replica(api, lease, "a", clock), replica(api, lease, "b", clock)
    await a.step()  # creates the Lease (nothing of the operator's in it yet)
    await b.step()
    ns, name = lease.split("/")
    owner = api.create(durable_stream(f"{name[:40]}-ds", namespace=ns)).json()
    ref = {
        **owner_reference(owner["metadata"]["name"], owner["metadata"]["uid"]),
        "controller": False,
    }
    # As the operator adds it (a merge patch), with what others may have put there.
    api.patch("Lease", ns, name, {"metadata": {"ownerReferences": [ref], **KEPT}})
    want = {"ownerReferences": [ref], **KEPT}
    assert kept(lease_meta(api, lease)) == want

    start = len(api.api.requests)
    clock.now += DURATION - 1
    await a.step()  # a renewal (the record as read, changed)
    assert a.record is not None and a.record.renew_time
    assert kept(lease_meta(api, lease)) == want
    assert await a.change_in_sync(["b"])  # an in-sync change
    assert kept(lease_meta(api, lease)) == want

    await b.step()
    clock.now += 3 * DURATION  # a stops renewing: b, in sync before, takes over
    await b.step()
    assert (b.state.role, b.state.term) == ("primary", 2)  # an election: a new record
    meta = lease_meta(api, lease)
    assert kept(meta) == want
    assert meta["annotations"][TERM] == "2"  # the servers' own annotations are theirs
    assert admission_checks(api, start) == []  # the references never changed


def test_a_record_writes_back_what_it_read_and_its_own_annotations_over_it():
    obj = {
        "metadata": {
            "name": "x-leader",
            "namespace": "ns",
            "resourceVersion": "7",
            "ownerReferences": [{"uid": "u", "kind": "DurableStream", "name": "x"}],
            "labels": {"a": "b"},
            "annotations": {TERM: "3", "streams.pyds.dev/retired": "1", "other/x": "y"},
        },
        "spec": {"holderIdentity": "r0"},
    }
    record = LeaseRecord.from_object(obj)
    record.term = 4
    out = record.to_object("ns", "x-leader")["metadata"]
    assert out["ownerReferences"] == obj["metadata"]["ownerReferences"]
    assert out["labels"] == {"a": "b"}
    assert out["annotations"][TERM] == "4" and out["annotations"]["other/x"] == "y"
    assert "streams.pyds.dev/retired" not in out["annotations"]  # ours: written afresh
    assert out["resourceVersion"] == "7"
