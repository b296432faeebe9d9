"""The emulated API server stores objects as kube-apiserver does: canonical quantities,
built-in defaults, field managers, and (when a test turns one on) a mutating webhook.

The operator's drift detection is only proven against what a real cluster hands back if
the emulator hands back the same: each test names the real behaviour it copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testkit import canonical
from testkit.cluster import Cluster, cluster
from testkit.mutating_webhook import PROXY, STATUS_ANNOTATION, VOLUME, SidecarInjector

NS = "default"


@pytest.fixture(scope="module")
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def apply(
    kube: Cluster, obj: dict[str, Any], manager: str | None, *, force: bool = False
) -> httpx.Response:
    """Server-side apply, as ``kubectl apply --server-side`` sends it."""
    params = {"fieldManager": manager} if manager else {}
    if force:
        params["force"] = "true"
    url = kube.path(obj["kind"], NS, obj["metadata"]["name"])
    headers = {"Content-Type": "application/apply-patch+yaml"}
    return kube.http.patch(url, json=obj, params=params, headers=headers)


def statefulset(name: str, **resources: Any) -> dict[str, Any]:
    labels = {"app": name}
    container = {"name": "server", "image": "ds:1.0", "ports": [{"containerPort": 4437}]}
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1024Mi"}},
                    },
                }
            ],
        },
    }


# -- quantities --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("0.5Ki", "512"),
        (".001Ki", "1024m"),
        (".000000000001Ki", "2n"),
        ("2000m", "2"),
        (2, "2"),
        ("0.5", "500m"),
        (0.5, "500m"),
        ("1000M", "1G"),
        ("100.035k", "100035"),
        ("3.001n", "4n"),
        ("1e3", "1e3"),
        ("1E3", "1e3"),
        ("1.2e4", "12e3"),
        ("0.5e-1", "50e-3"),
        ("-1.5", "-1500m"),
        ("0", "0"),
        ("0Gi", "0"),
    ],
)
def test_a_quantity_is_serialized_in_its_canonical_form(sent: Any, stored: str):
    """apimachinery's resource.Quantity (pkg/api/resource/quantity.go, its tests
    TestQuantityParseEmit and TestQuantityString): "1024Mi" is emitted as "1Gi", a
    binary quantity below 1024 or not an integer falls back to decimal SI (".001Ki" ->
    "1024m"), decimal SI keeps an integer mantissa with the largest suffix ("2000m" ->
    "2", "0.5" -> "500m"), an exponent stays an exponent in multiples of 3 ("1e3" is
    "1e3", not "1k"), and anything finer than 1n is rounded up ("3.001n" -> "4n")."""
    assert canonical.canonical(sent) == stored


def test_stored_objects_carry_canonical_quantities(kube: Cluster):
    """kube-apiserver decodes a body into typed objects: every Quantity field (a
    container's requests/limits, a claim's storage, an emptyDir's sizeLimit, in Pods,
    pod templates and claim templates) is read back canonical, a JSON number too."""
    sts = statefulset("quantities", requests={"cpu": 2, "memory": "1024Mi"}, limits={"cpu": "0.5"})
    sts["spec"]["template"]["spec"]["volumes"] = [
        {"name": "t", "emptyDir": {"sizeLimit": "2048Mi"}}
    ]
    kube.create(sts).raise_for_status()
    spec = kube.get("StatefulSet", NS, "quantities")["spec"]
    pod = spec["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "1Gi"},
        "limits": {"cpu": "500m"},
    }
    assert pod["volumes"][0]["emptyDir"] == {"sizeLimit": "2Gi"}
    assert spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"] == {"storage": "1Gi"}
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "quantities", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1.5Gi"}}},
    }
    kube.create(claim).raise_for_status()
    stored = kube.get("PersistentVolumeClaim", NS, "quantities")
    assert stored["spec"]["resources"]["requests"]["storage"] == "1536Mi"


def test_a_malformed_quantity_is_refused(kube: Cluster):
    """A body kube-apiserver cannot decode ("quantities must match the regular
    expression") is 400 BadRequest, nothing stored."""
    response = kube.create(statefulset("malformed", requests={"memory": "1 Gi"}))
    assert response.status_code == 400
    assert kube.get("StatefulSet", NS, "malformed") is None


# -- defaults ----------------------------------------------------------------------------


def test_a_statefulset_and_its_pod_template_get_the_defaults(kube: Cluster):
    """SetDefaults_StatefulSet (pkg/apis/apps/v1/defaults.go): replicas 1, OrderedReady,
    RollingUpdate with partition 0, revisionHistoryLimit 10, PVC retention Retain; the
    template's pod spec (pkg/apis/core/v1/defaults.go SetDefaults_PodSpec, _Container,
    _ContainerPort): restartPolicy Always, dnsPolicy ClusterFirst, schedulerName
    default-scheduler, securityContext {}, terminationGracePeriodSeconds 30,
    enableServiceLinks true, terminationMessagePath/Policy, imagePullPolicy (IfNotPresent
    for a tag other than latest), port protocol TCP; the claim template's volumeMode
    Filesystem (SetDefaults_PersistentVolumeClaimSpec)."""
    kube.create(statefulset("defaults")).raise_for_status()
    spec = kube.get("StatefulSet", NS, "defaults")["spec"]
    assert spec["replicas"] == 1
    assert spec["podManagementPolicy"] == "OrderedReady"
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert spec["revisionHistoryLimit"] == 10
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    pod = spec["template"]["spec"]
    assert {k: pod[k] for k in ("restartPolicy", "dnsPolicy", "schedulerName")} == {
        "restartPolicy": "Always",
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
    }
    assert pod["securityContext"] == {}
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["enableServiceLinks"] is True
    server = pod["containers"][0]
    assert server["terminationMessagePath"] == "/dev/termination-log"
    assert server["terminationMessagePolicy"] == "File"
    assert server["imagePullPolicy"] == "IfNotPresent"
    assert server["ports"] == [{"containerPort": 4437, "protocol": "TCP"}]
    assert spec["volumeClaimTemplates"][0]["spec"]["volumeMode"] == "Filesystem"


@pytest.mark.parametrize(
    ("image", "policy"),
    [("ds", "Always"), ("ds:latest", "Always"), ("r:5000/ds:1", "IfNotPresent")],
)
def test_image_pull_policy_follows_the_tag(image: str, policy: str):
    """SetDefaults_Container: Always for ``:latest`` or no tag, else IfNotPresent."""
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "c", "image": image}]}}
    canonical.stored("Pod", pod)
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == policy


def test_probes_and_volume_modes_get_their_defaults(kube: Cluster):
    """SetDefaults_Probe (timeout 1, period 10, success 1, failure 3), _HTTPGetAction
    (scheme HTTP), _SecretVolumeSource/_ProjectedVolumeSource (defaultMode 0644 = 420),
    _ObjectFieldSelector (fieldRef apiVersion v1); and SetDefaults_Pod: a container with
    limits and no requests requests its limits."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probed", "namespace": NS},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "ds:1",
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 80}},
                    "env": [
                        {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                    ],
                    "resources": {"limits": {"memory": "1024Mi"}},
                }
            ],
            "volumes": [
                {"name": "s", "secret": {"secretName": "s"}},
                {"name": "p", "projected": {"sources": []}},
            ],
        },
    }
    kube.create(pod).raise_for_status()
    spec = kube.get("Pod", NS, "probed")["spec"]
    container = spec["containers"][0]
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": 80, "scheme": "HTTP"},
        "timeoutSeconds": 1,
        "periodSeconds": 10,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
    assert container["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] == "v1"
    assert container["resources"] == {"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}
    assert [v.get("secret", v.get("projected"))["defaultMode"] for v in spec["volumes"]] == [
        420,
        420,
    ]


def test_a_service_gets_its_defaults_and_a_cluster_ip(kube: Cluster):
    """SetDefaults_Service (pkg/apis/core/v1/defaults.go): type ClusterIP,
    sessionAffinity None (ClientIP: a 10800 s timeout), port protocol TCP, targetPort =
    port, internalTrafficPolicy Cluster; and the Service REST storage
    (pkg/registry/core/service/storage) allocates a ClusterIP, single-stack IPv4; a
    headless Service keeps ``None``."""
    for name, spec in [
        ("plain", {"ports": [{"port": 80}]}),
        ("sticky", {"sessionAffinity": "ClientIP", "ports": [{"port": 80, "targetPort": "http"}]}),
        ("headless", {"clusterIP": "None", "ports": [{"port": 80}]}),
    ]:
        obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}
        obj["metadata"]["namespace"] = NS
        kube.create(obj).raise_for_status()
    plain = kube.get("Service", NS, "plain")["spec"]
    assert plain["type"] == "ClusterIP" and plain["sessionAffinity"] == "None"
    assert plain["ports"] == [{"port": 80, "targetPort": 80, "protocol": "TCP"}]
    assert plain["clusterIP"].startswith("10.96.") and plain["clusterIPs"] == [plain["clusterIP"]]
    assert plain["ipFamilies"] == ["IPv4"] and plain["ipFamilyPolicy"] == "SingleStack"
    assert plain["internalTrafficPolicy"] == "Cluster"
    sticky = kube.get("Service", NS, "sticky")["spec"]
    assert sticky["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    assert sticky["ports"][0]["targetPort"] == "http"
    assert sticky["clusterIP"] != plain["clusterIP"]
    headless = kube.get("Service", NS, "headless")["spec"]
    assert headless["clusterIP"] == "None" and headless["clusterIPs"] == ["None"]


def test_configmaps_and_budgets_are_stored_as_sent(kube: Cluster):
    """Neither ConfigMap nor policy/v1 PodDisruptionBudget has a defaulting function
    (a budget's status is the disruption controller's)."""
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "as-sent", "namespace": NS},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}},
    }
    kube.create(pdb).raise_for_status()
    assert kube.get("PodDisruptionBudget", NS, "as-sent")["spec"] == pdb["spec"]


# -- managed fields ----------------------------------------------------------------------


def entries(kube: Cluster, kind: str, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    meta = kube.get(kind, NS, name)["metadata"]
    return {(e["manager"], e["operation"]): e for e in meta["managedFields"]}


def config(name: str, data: dict[str, str], **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_each_manager_is_recorded_with_the_fields_it_set(kube: Cluster):
    """metadata.managedFields: one entry per manager and operation (Update for a
    create or patch, named after the User-Agent up to its "/" or ``fieldManager``;
    Apply for server-side apply), its fieldsV1 naming the fields it set."""
    kube.create(config("owned", {"a": "1"})).raise_for_status()
    apply(kube, config("owned", {"b": "2"}, team="x"), "op").raise_for_status()
    found = entries(kube, "ConfigMap", "owned")
    assert set(found) == {("python-httpx", "Update"), ("op", "Apply")}
    assert found["python-httpx", "Update"]["fieldsV1"] == {"f:data": {"f:a": {}}}
    assert found["op", "Apply"]["fieldsV1"] == {
        "f:data": {"f:b": {}},
        "f:metadata": {"f:labels": {"f:team": {}}},
    }
    assert found["op", "Apply"]["apiVersion"] == "v1"
    assert found["op", "Apply"]["fieldsType"] == "FieldsV1"
    assert kube.get("ConfigMap", NS, "owned")["data"] == {"a": "1", "b": "2"}


def test_an_apply_changing_another_managers_field_conflicts_unless_forced(kube: Cluster):
    """Server-side apply conflicts (kubernetes.io/docs/reference/using-api/server-side-apply,
    "Conflicts"): 409 Conflict with a FieldManagerConflict cause per field; the same
    value is shared ownership, no conflict; ``force=true`` takes the field over."""
    kube.create(config("contested", {"a": "1", "b": "1"})).raise_for_status()
    assert apply(kube, config("contested", {"a": "1"}), "op").status_code == 200  # same value
    refused = apply(kube, config("contested", {"a": "1", "b": "2"}), "op")
    assert refused.status_code == 409
    body = refused.json()
    assert body["reason"] == "Conflict"
    assert 'conflict with "python-httpx"' in body["message"] and ".data.b" in body["message"]
    assert body["details"]["causes"] == [
        {
            "type": "FieldManagerConflict",
            "message": 'conflict with "python-httpx" using v1',
            "field": ".data.b",
        }
    ]
    assert kube.get("ConfigMap", NS, "contested")["data"]["b"] == "1"
    apply(kube, config("contested", {"a": "1", "b": "2"}), "op", force=True).raise_for_status()
    assert kube.get("ConfigMap", NS, "contested")["data"]["b"] == "2"
    found = entries(kube, "ConfigMap", "contested")
    assert found["python-httpx", "Update"]["fieldsV1"] == {"f:data": {"f:a": {}}}
    assert found["op", "Apply"]["fieldsV1"] == {"f:data": {"f:a": {}, "f:b": {}}}


def test_a_field_the_applier_stops_sending_is_removed_unless_another_owns_it(kube: Cluster):
    """Server-side apply: "If a field is removed from the applied configuration and no
    other manager owns it, it is removed"; fields others set stay; an apply that changes
    nothing writes nothing (no new resourceVersion)."""
    apply(kube, config("pruned", {"a": "1", "b": "2"}), "op").raise_for_status()
    kube.patch("ConfigMap", NS, "pruned", {"data": {"c": "3"}}).raise_for_status()
    apply(kube, config("pruned", {"a": "1"}), "op").raise_for_status()
    stored = kube.get("ConfigMap", NS, "pruned")
    assert stored["data"] == {"a": "1", "c": "3"}
    apply(kube, config("pruned", {"a": "1"}), "op").raise_for_status()
    again = kube.get("ConfigMap", NS, "pruned")
    assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


def test_a_field_removed_by_another_writer_is_nobodys(kube: Cluster):
    """A field deleted from the object (a merge patch's null) leaves every manager's set:
    another applier may then set it without a conflict."""
    apply(kube, config("released", {"a": "1", "b": "2"}), "op").raise_for_status()
    kube.patch("ConfigMap", NS, "released", {"data": {"b": None}}).raise_for_status()
    assert entries(kube, "ConfigMap", "released")["op", "Apply"]["fieldsV1"] == {
        "f:data": {"f:a": {}}
    }
    assert apply(kube, config("released", {"b": "3"}), "other").status_code == 200
    assert kube.get("ConfigMap", NS, "released")["data"] == {"a": "1", "b": "3"}


def test_an_apply_needs_a_field_manager(kube: Cluster):
    """kube-apiserver: "fieldManager: Required value: is required for apply patch"."""
    assert apply(kube, config("unmanaged", {"a": "1"}), None).status_code == 422


def test_an_apply_compares_as_stored_so_a_rewritten_quantity_is_no_change(kube: Cluster):
    """The server compares typed, defaulted objects: applying "1024Mi" where "1Gi" is
    stored changes nothing, and no new version is written."""
    sts = statefulset("same-value", requests={"memory": "1024Mi"})
    apply(kube, sts, "op").raise_for_status()
    before = kube.get("StatefulSet", NS, "same-value")["metadata"]["resourceVersion"]
    apply(kube, sts, "op").raise_for_status()
    assert kube.get("StatefulSet", NS, "same-value")["metadata"]["resourceVersion"] == before


# -- the mutating webhook ----------------------------------------------------------------


@pytest.fixture
def injector(kube: Cluster) -> Iterator[SidecarInjector]:
    kube.api.webhook = webhook = SidecarInjector()
    try:
        yield webhook
    finally:
        kube.api.webhook = None


def test_the_injector_adds_its_sidecar_to_pods_and_pod_templates(
    kube: Cluster, injector: SidecarInjector
):
    """A mutating admission webhook (Istio's injector) changes the object before it is
    stored: a container, a volume, a label and an annotation appear that the writer never
    sent, defaulted like the rest; it is called again on every update and adds nothing
    twice; other kinds pass untouched."""
    kube.create(statefulset("injected")).raise_for_status()
    template = kube.get("StatefulSet", NS, "injected")["spec"]["template"]
    assert [c["name"] for c in template["spec"]["containers"]] == ["server", PROXY]
    assert template["spec"]["containers"][1]["terminationMessagePolicy"] == "File"
    assert [v["name"] for v in template["spec"]["volumes"]] == [VOLUME]
    assert template["metadata"]["labels"]["security.istio.io/tlsMode"] == "istio"
    assert STATUS_ANNOTATION in template["metadata"]["annotations"]
    kube.patch("StatefulSet", NS, "injected", {"spec": {"replicas": 2}}).raise_for_status()
    again = kube.get("StatefulSet", NS, "injected")["spec"]["template"]["spec"]
    assert [c["name"] for c in again["containers"]] == ["server", PROXY]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "injected-0", "namespace": NS},
        "spec": {"containers": [{"name": "server", "image": "ds:1"}]},
    }
    kube.create(pod).raise_for_status()
    stored = kube.get("Pod", NS, "injected-0")
    assert [c["name"] for c in stored["spec"]["containers"]] == ["server", PROXY]
    assert stored["metadata"]["labels"]["security.istio.io/tlsMode"] == "istio"
    # Registered for pods, not pods/status: the kubelet's status writes pass it by.
    calls = len(injector.seen)
    status = {"status": {"phase": "Running"}}
    kube.patch("Pod", NS, "injected-0", status, status=True).raise_for_status()
    assert len(injector.seen) == calls
    kube.create(config("not-injected", {"a": "1"})).raise_for_status()
    assert "labels" not in kube.get("ConfigMap", NS, "not-injected")["metadata"]
    assert ("StatefulSet", "injected") in injector.seen
