"""The emulated API server behaves like kube-apiserver where the operator tests rely on it.

If one of these fails, the operator tests built on testkit.kube prove less
than they claim: fix the emulator first.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import KMOCK_HISTORY, RESIZE_FORBIDDEN, durable_stream, storage_class

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


def test_an_object_created_after_its_owner_went_is_collected(kube: Cluster):
    """As kube-apiserver's garbage collector: owner references to no live object (a
    controller that read its owner just before the owner was deleted) get the object
    deleted; the create itself is answered as usual. Issue 25: an operator round that
    read its DurableStream before the delete recreated a StatefulSet nothing collected."""
    kube.create(config_map("gone-owner")).raise_for_status()
    gone = kube.get("ConfigMap", NS, "gone-owner")["metadata"]["uid"]
    kube.delete("ConfigMap", NS, "gone-owner").raise_for_status()
    kube.create(config_map("kept-owner")).raise_for_status()
    kept = kube.get("ConfigMap", NS, "kept-owner")["metadata"]["uid"]

    def owned_by(name: str, *uids: str) -> dict:
        obj = config_map(name)
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid} for uid in uids
        ]
        return obj

    assert kube.create(owned_by("orphan", gone)).status_code == 201
    assert kube.create(owned_by("half-orphan", gone, kept)).status_code == 201
    wait_for(lambda: kube.get("ConfigMap", NS, "orphan") is None, message="the orphan collected")
    assert kube.get("ConfigMap", NS, "half-orphan") is not None  # one owner still lives


def pvc(name: str, size: str, storage_class: str | None = None) -> dict:
    spec: dict = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def grow(kube: Cluster, name: str, size: str):
    body = {"spec": {"resources": {"requests": {"storage": size}}}}
    return kube.patch("PersistentVolumeClaim", NS, name, body)


def test_a_claim_without_a_class_gets_the_default_one(kube: Cluster):
    kube.create(pvc("defaulted", "1Gi")).raise_for_status()
    assert kube.get("PersistentVolumeClaim", NS, "defaulted")["spec"]["storageClassName"] == (
        "standard"
    )
    kube.create(pvc("static", "1Gi", storage_class="")).raise_for_status()  # "": no class, kept
    assert kube.get("PersistentVolumeClaim", NS, "static")["spec"]["storageClassName"] == ""


def test_growing_a_claim_needs_a_class_that_allows_expansion(kube: Cluster):
    kube.create(storage_class("fixed", expandable=None)).raise_for_status()
    kube.create(storage_class("fixed-false", expandable=False)).raise_for_status()
    for name, cls in [("on-fixed", "fixed"), ("on-fixed-false", "fixed-false"), ("none", "")]:
        kube.create(pvc(name, "1Gi", storage_class=cls)).raise_for_status()
        r = grow(kube, name, "5Gi")
        assert r.status_code == 403, (name, r.text)
        assert r.json()["reason"] == "Forbidden" and RESIZE_FORBIDDEN in r.json()["message"]
        live = kube.get("PersistentVolumeClaim", NS, name)
        assert live["spec"]["resources"]["requests"]["storage"] == "1Gi"  # unchanged
        # Only growth is refused: other changes, and the same size written again, pass.
        assert grow(kube, name, "1024Mi").status_code == 200
        labelled = {"metadata": {"labels": {"x": "y"}}}
        assert kube.patch("PersistentVolumeClaim", NS, name, labelled).status_code == 200
    # The standard class allows it; so does a class once expansion is switched on.
    kube.create(pvc("on-standard", "1Gi")).raise_for_status()
    assert grow(kube, "on-standard", "5Gi").status_code == 200
    kube.patch("StorageClass", None, "fixed", {"allowVolumeExpansion": True}).raise_for_status()
    assert grow(kube, "on-fixed", "5Gi").status_code == 200
    assert kube.get("PersistentVolumeClaim", NS, "on-fixed")["spec"]["resources"]["requests"][
        "storage"
    ] == ("5Gi")


def test_requests_are_recorded_as_rbac_verbs(kube: Cluster):
    before = len(kube.api.requests)
    kube.create(config_map("verbs")).raise_for_status()
    kube.get("ConfigMap", NS, "verbs")
    kube.list("ConfigMap", NS)
    kube.patch("ConfigMap", NS, "verbs", {"data": {"a": "2"}}).raise_for_status()
    kube.patch("DurableStream", NS, "sub", {"status": {"phase": "x"}}, status=True)
    kube.delete("ConfigMap", NS, "verbs").raise_for_status()
    kube.http.get("/api")  # discovery: no resource, no verb to grant
    kube.http.get("/apis/streams.pyds.dev/v1alpha1")
    assert kube.api.requests[-1].agent.startswith("python-httpx/")
    assert [c[:3] for c in kube.api.requests[before:]] == [
        ("create", "", "configmaps"),
        ("get", "", "configmaps"),
        ("list", "", "configmaps"),
        ("patch", "", "configmaps"),
        ("patch", "streams.pyds.dev", "durablestreams/status"),
        ("delete", "", "configmaps"),
    ]


def test_kmocks_own_request_history_stays_short_while_ours_keeps_every_call(kube: Cluster):
    """kmock scans its whole history to serve each request: kept, a long test made every
    request slower than the last (testkit.kube.ApiServer._forget_served). Served requests
    leave it; the reactions' own records stay bounded."""
    before = len(kube.api.requests)
    kube.create(config_map("many")).raise_for_status()
    for _ in range(5 * KMOCK_HISTORY):
        assert kube.get("ConfigMap", NS, "many") is not None
    assert len(kube.api._requests) == 0
    assert all(len(p._requests) <= 2 * KMOCK_HISTORY for p in kube.api._payloads)
    assert len(kube.api.requests) - before == 1 + 5 * KMOCK_HISTORY
    kube.patch("ConfigMap", NS, "many", {"data": {"a": "b"}}).raise_for_status()
    assert kube.get("ConfigMap", NS, "many")["data"] == {"a": "b"}


def test_a_crd_is_established_and_an_updated_crd_serves_its_new_schema():
    """What ``helm install`` waits for (Established) and ``helm upgrade`` of a CRD template
    relies on: the schema of the CRD as updated, not as first created."""
    with cluster(crd=False) as c:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object"}},
                    }
                ],
            },
        }
        c.create(crd).raise_for_status()
        url = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com"
        status = c.http.get(url).json()["status"]
        conditions = {x["type"]: x["status"] for x in status["conditions"]}
        assert conditions == {"NamesAccepted": "True", "Established": "True"}
        assert status["acceptedNames"]["kind"] == "Widget"
        widget = {"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"size": "big"}}
        base = "/apis/example.com/v1/namespaces/default/widgets"
        assert c.http.post(base, json={**widget, "metadata": {"name": "w1"}}).status_code == 201
        schema = {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}},
        }
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = schema
        c.http.put(url, json=crd).raise_for_status()
        assert c.http.post(base, json={**widget, "metadata": {"name": "w2"}}).status_code == 422


def test_discovery_names_the_core_group_version_v1_and_openapi_v2_is_empty(kube: Cluster):
    """client-go's REST mapper (helm's) finds no core kind under kmock's ``/v1``; its
    client-side validation reads ``/openapi/v2`` (no schema published: nothing checked)."""
    assert kube.http.get("/api/v1").json()["groupVersion"] == "v1"
    assert kube.http.get("/apis/apps/v1").json()["groupVersion"] == "apps/v1"
    openapi = kube.http.get("/openapi/v2")
    assert openapi.status_code == 200 and openapi.content == b""


def _pb(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (all these tests need)."""
    size, out = len(value), b""
    while size > 0x7F:
        out += bytes([size & 0x7F | 0x80])
        size >>= 7
    return bytes([number << 3 | 2]) + out + bytes([size]) + value


def _protobuf_secret(name: str, labels: dict[str, str], data: dict[str, bytes]) -> bytes:
    """A Secret as client-go's protobuf serializer writes it (k8s.io/api generated.proto):
    the ``k8s\\0`` magic, then runtime.Unknown{typeMeta{apiVersion, kind}, raw}."""
    meta = _pb(1, name.encode()) + _pb(3, b"default")
    for k, v in labels.items():
        meta += _pb(11, _pb(1, k.encode()) + _pb(2, v.encode()))
    secret = _pb(1, meta) + b"".join(
        _pb(2, _pb(1, k.encode()) + _pb(2, v)) for k, v in data.items()
    )
    secret += _pb(3, b"helm.sh/release.v1")
    return b"k8s\x00" + _pb(1, _pb(1, b"v1") + _pb(2, b"Secret")) + _pb(2, secret)


def test_protobuf_secrets_are_read_as_helm_writes_its_releases(kube: Cluster):
    headers = {"Content-Type": "application/vnd.kubernetes.protobuf"}
    body = _protobuf_secret("sh.helm.release.v1.r.v1", {"owner": "helm"}, {"release": b"\x00\xff"})
    made = kube.http.post("/api/v1/namespaces/default/secrets", content=body, headers=headers)
    assert made.status_code == 201
    secret = kube.http.get("/api/v1/namespaces/default/secrets/sh.helm.release.v1.r.v1").json()
    assert secret["metadata"]["labels"] == {"owner": "helm"}
    assert secret["data"] == {"release": "AP8="} and secret["type"] == "helm.sh/release.v1"
    listed = kube.http.get(
        "/api/v1/namespaces/default/secrets", params={"labelSelector": "owner=helm"}
    )
    assert [s["metadata"]["name"] for s in listed.json()["items"]] == ["sh.helm.release.v1.r.v1"]
    # An update (PUT) in protobuf too; a kind it cannot read is 415, not a 500.
    body = _protobuf_secret("sh.helm.release.v1.r.v1", {"owner": "helm", "status": "deployed"}, {})
    url = "/api/v1/namespaces/default/secrets/sh.helm.release.v1.r.v1"
    kube.http.put(url, content=body, headers=headers).raise_for_status()
    assert kube.http.get(url).json()["metadata"]["labels"]["status"] == "deployed"
    pod = b"k8s\x00" + _pb(1, _pb(1, b"v1") + _pb(2, b"Pod")) + _pb(2, b"")
    answer = kube.http.post("/api/v1/namespaces/default/pods", content=pod, headers=headers)
    assert answer.status_code == 415


def test_with_tokens_set_only_those_bearer_tokens_are_let_in(kube: Cluster):
    """What the service-account token tests (tests/replication/test_kube_auth.py) rely
    on: an expired (here: unknown) token is 401 before anything is read or written."""
    path = kube.path("ConfigMap", NS, "guarded")
    kube.api.tokens = {"current"}
    try:
        refused = kube.api.unauthorized
        assert kube.http.get(path).status_code == 401
        old = kube.http.get(path, headers={"Authorization": "Bearer rotated-away"})
        assert old.status_code == 401 and old.json()["reason"] == "Unauthorized"
        ok = kube.http.get(path, headers={"Authorization": "Bearer current"})
        assert ok.status_code == 404  # let in: there is no such ConfigMap
        assert kube.api.unauthorized == refused + 2
    finally:
        kube.api.tokens = None
    assert kube.http.get(path).status_code == 404
