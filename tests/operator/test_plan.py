"""The reconcile's decisions (drift, growth, leftovers), as pure functions."""

from __future__ import annotations

import pytest

from stream_operator.api.quantities import as_bytes as quantity_bytes
from stream_operator.decisions.plan import (
    Expansion,
    drifted_fields,
    plan_expansion,
    short_claims,
    smaller_pvcs,
    stale_objects,
)


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
    assert drifted_fields({"x": {"y": 1}}, {"x": "scalar"}) == ["x"]


def rendered_statefulset() -> dict:
    """The parts of a rendered StatefulSet the drift rules below are about."""
    return {
        "metadata": {"labels": {"app": "ds"}, "annotations": {}},
        "spec": {
            "replicas": 1,
            "template": {
                "metadata": {"labels": {"app": "ds"}},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "ds:1",
                            "args": ["serve"],
                            "env": [
                                {"name": "A", "value": "1"},
                                {"name": "B", "value": "$(A)"},
                            ],
                            "ports": [{"name": "http", "containerPort": 4437}],
                            "resources": {
                                "requests": {"cpu": 2, "memory": "1024Mi"},
                                "limits": {"memory": "1.5Gi", "ephemeral-storage": "0.5"},
                            },
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1024Mi"}}],
                    "initContainers": [],
                },
            },
        },
    }


def as_stored_and_injected() -> dict:
    """``rendered_statefulset`` as a real API server stores it (canonical quantities,
    defaults, empty fields omitted) after a sidecar injector added its container, volume,
    variable, port, mount, label and annotation."""
    live = rendered_statefulset()
    del live["metadata"]["annotations"]
    live["metadata"]["labels"]["injected"] = "yes"
    pod = live["spec"]["template"]
    pod["metadata"]["labels"]["security.istio.io/tlsMode"] = "istio"
    pod["metadata"]["annotations"] = {"sidecar.istio.io/status": "{}"}
    spec = pod["spec"]
    del spec["initContainers"]
    spec.update(dnsPolicy="ClusterFirst", restartPolicy="Always", securityContext={})
    server = spec["containers"][0]
    server.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
    server["resources"] = {
        "requests": {"cpu": "2", "memory": "1Gi"},
        "limits": {"memory": "1536Mi", "ephemeral-storage": "500m"},
    }
    server["ports"][0]["protocol"] = "TCP"
    server["ports"].insert(0, {"name": "envoy", "containerPort": 15090, "protocol": "TCP"})
    server["env"].insert(0, {"name": "ISTIO_META", "value": "x"})
    server["volumeMounts"].append({"name": "istio-envoy", "mountPath": "/etc/istio"})
    spec["containers"].insert(0, {"name": "istio-proxy", "image": "proxyv2"})
    spec["volumes"][0]["emptyDir"]["sizeLimit"] = "1Gi"
    spec["volumes"].append({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}})
    return live


def test_what_the_api_server_and_an_injector_did_is_not_drift():
    """Issue 42, part 3: canonical quantities, defaults, omitted empty fields, and the
    items, labels and annotations a sidecar injector added, read back every round, were
    drift, corrected every resync, forever."""
    assert drifted_fields(rendered_statefulset(), as_stored_and_injected()) == []


SERVER = "spec.template.spec.containers[name=server]"


@pytest.mark.parametrize(
    ("edit", "drift"),
    [
        (lambda s: s.update(image="ds:2"), f"{SERVER}.image"),
        (lambda s: s["env"][2].update(value="$(POD)"), f"{SERVER}.env[name=B].value"),
        (lambda s: s["env"].pop(1), f"{SERVER}.env[name=A]"),
        (
            lambda s: s["resources"]["requests"].update(memory="2Gi"),
            f"{SERVER}.resources.requests.memory",
        ),
        (lambda s: s["ports"][1].update(containerPort=80), f"{SERVER}.ports[containerPort=4437]"),
        (lambda s: s["volumeMounts"].pop(0), f"{SERVER}.volumeMounts[mountPath=/tmp]"),
        (lambda s: s["args"].append("--debug"), f"{SERVER}.args"),
    ],
)
def test_a_rendered_item_changed_or_missing_is_drift_found_by_its_name(edit, drift):
    """Among the injector's items, ours are found by their name (mountPath, containerPort)
    and a change to one is drift at that item, not "the list is longer"."""
    live = as_stored_and_injected()
    edit(live["spec"]["template"]["spec"]["containers"][1])
    assert drifted_fields(rendered_statefulset(), live) == [drift]


def test_a_rendered_container_or_volume_gone_is_drift():
    live = as_stored_and_injected()
    spec = live["spec"]["template"]["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "tmp"]
    del spec["containers"][1]
    assert drifted_fields(rendered_statefulset(), live) == [
        "spec.template.spec.containers[name=server]",
        "spec.template.spec.volumes[name=tmp]",
    ]


def test_our_variables_reordered_is_drift():
    """Order matters for env: ``$(A)`` expands only after A is defined."""
    live = as_stored_and_injected()
    env = live["spec"]["template"]["spec"]["containers"][1]["env"]
    env[1], env[2] = env[2], env[1]
    assert drifted_fields(rendered_statefulset(), live) == [f"{SERVER}.env"]


def test_a_service_port_is_found_by_its_port():
    desired = {"spec": {"ports": [{"name": "http", "port": 4437, "targetPort": "http"}]}}
    live = {
        "spec": {
            "ports": [
                {"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"},
                {"name": "http", "port": 4437, "targetPort": "http", "protocol": "TCP"},
            ]
        }
    }
    assert drifted_fields(desired, live) == []
    live["spec"]["ports"][1]["targetPort"] = 8080
    assert drifted_fields(desired, live) == ["spec.ports[port=4437].targetPort"]


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
        owned("PodMonitor", "x"),
        owned("PodMonitor", "other-owner", uid="someone-else"),
        owned("PodMonitor", "not-controller", controller=False),
        owned("ConfigMap", "going", deletionTimestamp="2026-01-01T00:00:00Z"),
        {"kind": "ConfigMap", "metadata": {"name": "hand-made"}},
    ]
    assert stale_objects(live, [("Service", "x")], "me") == [("PodMonitor", "x")]
    assert stale_objects(live, [("Service", "x"), ("PodMonitor", "x")], "me") == []


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


def test_a_port_is_its_number_and_protocol():
    """53/UDP and 53/TCP in one rule are two ports, not one read twice (a NetworkPolicy's
    DNS egress drifted at every resync when ports were keyed by number alone)."""
    desired = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert drifted_fields(desired, {"ports": list(reversed(desired["ports"]))}) == ["ports"]
    assert drifted_fields(desired, {"ports": [dict(p) for p in desired["ports"]]}) == []
    assert (
        drifted_fields({"ports": [{"port": 80}]}, {"ports": [{"port": 80, "protocol": "TCP"}]})
        == []
    )
    assert drifted_fields(desired, {"ports": [{"port": 53, "protocol": "TCP"}]}) == [
        "ports[port=53]"
    ]
