"""The reconcile's decisions (drift, growth, leftovers), as pure functions."""

from __future__ import annotations

from stream_operator.plan import (
    Expansion,
    drifted_fields,
    plan_expansion,
    short_claims,
    smaller_pvcs,
    stale_objects,
)
from stream_operator.spec import quantity_bytes


def test_drift_is_a_rendered_field_missing_or_changed():
    desired = {
        "metadata": {"labels": {"a": "1"}},
        "spec": {"replicas": 2, "ports": [{"name": "http", "port": 80}]},
    }
    # The API server adds fields, inside list items too: not drift.
    live = {
        "metadata": {"labels": {"a": "1", "extra": "x"}, "uid": "u"},
        "spec": {"replicas": 2, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        "status": {},
    }
    assert drifted_fields(desired, live) == []
    live["spec"]["replicas"] = 0
    del live["metadata"]["labels"]["a"]
    assert drifted_fields(desired, live) == ["metadata.labels.a", "spec.replicas"]
    live["spec"]["ports"].append({"name": "other", "port": 81})
    assert "spec.ports" in drifted_fields(desired, live)
    assert drifted_fields({"x": {"y": 1}}, {"x": "scalar"}) == ["x"]


def pvc(name: str, size: str | None, cls: str | None = "standard") -> dict:
    spec: dict = {"resources": {"requests": {"storage": size}} if size else {}}
    if cls is not None:
        spec["storageClassName"] = cls
    return {"metadata": {"name": name}, "spec": spec}


def test_only_smaller_claims_need_growth():
    pvcs = [pvc("a", "1Gi"), pvc("b", "5Gi"), pvc("c", "6Gi"), pvc("d", None)]
    names = [p["metadata"]["name"] for p in smaller_pvcs(pvcs, "5Gi", quantity_bytes)]
    assert names == ["a", "d"]


def test_growth_is_promised_only_where_the_storage_class_allows_it():
    classes = {
        "standard": {"allowVolumeExpansion": True},
        "fixed": {"provisioner": "x"},  # absent means false
        "off": {"allowVolumeExpansion": False},
        "gone": None,
    }
    smaller = [
        pvc("ok", "1Gi", "standard"),
        pvc("fixed", "1Gi", "fixed"),
        pvc("off", "1Gi", "off"),
        pvc("gone", "1Gi", "gone"),
        pvc("static", "1Gi", cls=None),
        pvc("static2", "1Gi", cls=""),
    ]
    plan = plan_expansion(smaller, classes)
    assert plan.grow == ["ok"]
    assert plan.blocked == {
        "fixed": "StorageClass fixed does not allow volume expansion",
        "off": "StorageClass off does not allow volume expansion",
        "gone": "StorageClass gone does not exist",
        "static": "the claim has no StorageClass (statically provisioned)",
        "static2": "the claim has no StorageClass (statically provisioned)",
    }
    assert plan_expansion([pvc("ok", "1Gi")], classes) == Expansion(grow=["ok"])
    one = plan_expansion([pvc("data-x-0", "1Gi", "fixed")], classes)
    assert one.message("5Gi") == (
        "cannot grow data-x-0 to 5Gi: StorageClass fixed does not allow volume expansion"
    )


def owned(kind: str, name: str, uid: str = "me", controller: bool = True, **meta) -> dict:
    ref = {"uid": uid, "controller": controller}
    return {"kind": kind, "metadata": {"name": name, "ownerReferences": [ref], **meta}}


def test_stale_objects_are_owned_and_no_longer_rendered():
    live = [
        owned("Service", "x"),
        owned("ServiceMonitor", "x"),
        owned("ServiceMonitor", "other-owner", uid="someone-else"),
        owned("ServiceMonitor", "not-controller", controller=False),
        owned("ConfigMap", "going", deletionTimestamp="2026-01-01T00:00:00Z"),
        {"kind": "ConfigMap", "metadata": {"name": "hand-made"}},
    ]
    assert stale_objects(live, [("Service", "x")], "me") == [("ServiceMonitor", "x")]
    assert stale_objects(live, [("Service", "x"), ("ServiceMonitor", "x")], "me") == []


def test_short_claims_count_request_and_capacity_of_the_serving_ordinals():
    """Issue 15, finding 4: a grown request is a promise until the capacity follows."""

    def claim(name: str, request: str, capacity: str | None = None) -> dict:
        out: dict = {"metadata": {"name": name}}
        out["spec"] = {"resources": {"requests": {"storage": request}}}
        if capacity:
            out["status"] = {"capacity": {"storage": capacity}}
        return out

    pvcs = [
        claim("data-ev-0", "5Gi", "5Gi"),
        claim("data-ev-1", "5Gi", "1Gi"),  # resizing
        claim("data-ev-2", "1Gi"),  # from the template, unbound
        claim("data-ev-3", "1Gi", "1Gi"),  # retained after a scale-down: no pod's volume
    ]
    assert short_claims(pvcs, "5Gi", 3, quantity_bytes) == {
        "data-ev-1": "1Gi",
        "data-ev-2": "1Gi",
    }
    assert short_claims(pvcs[:1], "5Gi", 3, quantity_bytes) == {}
