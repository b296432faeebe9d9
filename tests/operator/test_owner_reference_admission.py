"""Issue 42: owner references under the OwnerReferencesPermissionEnforcement admission plugin.

Every object the operator renders names its DurableStream as owner with
``blockOwnerDeletion: true``; with the plugin on (OpenShift's default), kube-apiserver
then asks whether the writer may ``update`` the owner's ``finalizers`` subresource,
and refused every create while the operator's RBAC did not grant it. The emulator
records that check as a request (testkit/owner_refs.py), so every RBAC test that
compares the operator's requests with the chart's roles asks for it; here, the
emulator's part, and the installed RBAC against what the operator renders.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stream_operator.specs.render import desired_objects, owner_reference
from testkit import rbac
from testkit.cluster import Cluster, cluster
from testkit.kube import Call, durable_stream
from testkit.operator_rbac import cluster_wide_rbac

NS = "default"
FINALIZERS = ("update", "streams.pyds.dev", "durablestreams/finalizers")


@pytest.fixture(scope="module")
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def config_map(name: str, *refs: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if refs:
        meta["ownerReferences"] = list(refs)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"a": "1"}}


def checks_since(c: Cluster, start: int) -> list[tuple[str, str, str, str | None]]:
    """The admission checks recorded since request ``start`` (verb, group, resource, name)."""
    return [
        (call.verb, call.group, call.resource, call.name)
        for call in c.api.requests[start:]
        if call.resource.endswith("/finalizers") or call.verb == "delete"
    ]


def test_the_emulator_records_the_plugins_checks(kube: Cluster):
    owner = kube.create(durable_stream("owner")).json()
    uid = owner["metadata"]["uid"]
    blocking = owner_reference("owner", uid)
    plain = {k: v for k, v in blocking.items() if k != "blockOwnerDeletion"}

    start = len(kube.api.requests)
    kube.create(config_map("blocks", blocking)).raise_for_status()
    assert checks_since(kube, start) == [(*FINALIZERS, "owner")]  # a create: no delete check

    start = len(kube.api.requests)
    kube.create(config_map("owned", plain)).raise_for_status()
    kube.create(config_map("free")).raise_for_status()
    kube.patch("ConfigMap", NS, "blocks", {"data": {"a": "2"}}).raise_for_status()
    assert checks_since(kube, start) == []  # no blocking reference, or no change of them

    start = len(kube.api.requests)
    kube.patch("ConfigMap", NS, "free", {"metadata": {"ownerReferences": [plain]}})
    assert checks_since(kube, start) == [("delete", "", "configmaps", "free")]  # adopted

    start = len(kube.api.requests)
    kube.patch("ConfigMap", NS, "owned", {"metadata": {"ownerReferences": [blocking]}})
    assert checks_since(kube, start) == [
        ("delete", "", "configmaps", "owned"),
        (*FINALIZERS, "owner"),
    ]


def test_the_installed_rbac_lets_the_operator_block_its_owners_deletion(kube: Cluster):
    """What the operator renders for a replica set (every built-in kind it makes), created
    in the emulator: each create's admission checks are granted by the chart's cluster-wide RBAC
    (the chart's RBAC; tests/operator/test_rbac.py runs the operator under the chart's)."""
    owner = kube.create(durable_stream("rendered", {"replicas": 3})).json()
    objs = desired_objects("rendered", NS, owner["metadata"]["uid"], {"replicas": 3})
    start = len(kube.api.requests)
    for obj in objs:
        kube.create(obj).raise_for_status()
    checks = [call for call in kube.api.requests[start:] if call.resource.endswith("/finalizers")]
    assert len(checks) == len(objs)
    granted = rbac.grants(cluster_wide_rbac(), "durable-streams", "durable-streams")
    assert rbac.denied(checks, granted) == []
    # And the grant is that one check, not more: no other verb on the finalizers.
    on_finalizers = {(g.verb, g.resource) for g in granted if g.resource.endswith("/finalizers")}
    assert on_finalizers == {("update", "durablestreams/finalizers")}
    assert not rbac.allowed(Call("update", "streams.pyds.dev", "durablestreams", "", NS), granted)
