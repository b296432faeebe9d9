"""The emulated API server behaves like kube-apiserver where the operator tests rely on it.

If one of these fails, the operator tests built on testkit.kube prove less
than they claim: fix the emulator first.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.kube import Cluster, cluster, durable_stream

NS = "default"


@pytest.fixture(scope="module")
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def config_map(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"a": "1"},
    }


def test_create_stamps_and_refuses_duplicates(kube: Cluster):
    assert kube.create(config_map("stamped")).status_code == 201
    meta = kube.get("ConfigMap", NS, "stamped")["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    assert kube.create(config_map("stamped")).status_code == 409


def test_patches_bump_resource_version_and_generation_only_when_needed(kube: Cluster):
    kube.create(config_map("versions")).raise_for_status()
    v1 = kube.get("ConfigMap", NS, "versions")["metadata"]
    kube.patch("ConfigMap", NS, "versions", {"data": {"a": "1"}}).raise_for_status()  # no-op
    assert (
        kube.get("ConfigMap", NS, "versions")["metadata"]["resourceVersion"]
        == (v1["resourceVersion"])
    )
    kube.patch("ConfigMap", NS, "versions", {"metadata": {"labels": {"x": "y"}}})
    v2 = kube.get("ConfigMap", NS, "versions")["metadata"]
    assert int(v2["resourceVersion"]) > int(v1["resourceVersion"])
    assert v2["generation"] == 1  # metadata only
    kube.patch("ConfigMap", NS, "versions", {"data": {"a": "2"}})
    assert kube.get("ConfigMap", NS, "versions")["metadata"]["generation"] == 2


def test_status_subresource_is_separate(kube: Cluster):
    ds = {**durable_stream("sub", {"replicas": 1}), "status": {"phase": "Ready"}}
    kube.create(ds).raise_for_status()
    assert "status" not in kube.get("DurableStream", NS, "sub")  # dropped on create
    kube.patch("DurableStream", NS, "sub", {"status": {"phase": "Ready"}}).raise_for_status()
    assert "status" not in kube.get("DurableStream", NS, "sub")  # ignored on the main resource
    kube.patch(
        "DurableStream",
        NS,
        "sub",
        {"spec": {"replicas": 5}, "status": {"phase": "Pending"}},
        status=True,
    ).raise_for_status()
    obj = kube.get("DurableStream", NS, "sub")
    assert obj["status"] == {"phase": "Pending"} and obj["spec"]["replicas"] == 1


def test_custom_resources_are_validated_against_their_crd(kube: Cluster):
    r = kube.create(durable_stream("bad", {"replicas": 0}))
    assert r.status_code == 422 and "replicas" in r.json()["message"]
    assert kube.get("DurableStream", NS, "bad") is None


def test_failed_json_patch_test_is_422(kube: Cluster):
    kube.create(config_map("jsonpatch")).raise_for_status()
    r = kube.http.patch(
        kube.path("ConfigMap", NS, "jsonpatch"),
        json=[{"op": "test", "path": "/data/a", "value": "nope"}],
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert r.status_code == 422


def test_label_selectors_and_finalizers_and_garbage_collection(kube: Cluster):
    owner = config_map("owner", team="a")
    owner["metadata"]["finalizers"] = ["example.com/hold"]
    kube.create(owner).raise_for_status()
    kube.create(config_map("other", team="b")).raise_for_status()
    assert [o["metadata"]["name"] for o in kube.list("ConfigMap", NS, "team=a")] == ["owner"]
    uid = kube.get("ConfigMap", NS, "owner")["metadata"]["uid"]
    child = config_map("child")
    child["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
    ]
    kube.create(child).raise_for_status()
    kube.delete("ConfigMap", NS, "owner").raise_for_status()
    held = kube.get("ConfigMap", NS, "owner")
    assert held["metadata"]["deletionTimestamp"]  # waits for its finalizer
    assert kube.get("ConfigMap", NS, "child") is not None
    kube.patch("ConfigMap", NS, "owner", {"metadata": {"finalizers": None}}).raise_for_status()
    assert kube.get("ConfigMap", NS, "owner") is None
    assert kube.get("ConfigMap", NS, "child") is None  # collected with its owner
    assert kube.get("ConfigMap", NS, "other") is not None
