"""What platform teams set on the server pods (issue 42): labels, annotations, the pods'
ServiceAccount (IRSA, workload identity), placement and security contexts. Pure
rendering, each object checked against Kubernetes' own schema (kubernetes-validate)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest

from stream_operator.api.spec import refused_change
from stream_operator.configuration import operator_settings
from stream_operator.specs.render import (
    CONFIG_HASH,
    desired_objects,
    render_statefulset,
    selector,
)

UID = "1234-uid"
K8S_VERSION = "1.31"
ROLE_ARN = "arn:aws:iam::111122223333:role/durable-streams-archive"
IRSA = {"serviceAccount": {"metadata": {"annotations": {"eks.amazonaws.com/role-arn": ROLE_ARN}}}}
BACKUP = {"objectStore": {"destinationPath": "s3://archive/events"}}


@pytest.fixture
def settings() -> Iterator[None]:
    """The operator's settings as the test loads them, put back afterwards."""
    yield
    operator_settings.load({})


def pod_of(spec: dict[str, Any]) -> dict[str, Any]:
    sts = render_statefulset("ev", "ns", UID, spec)
    kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    template: dict[str, Any] = sts["spec"]["template"]
    return template


def kinds(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    objs = desired_objects("ev", "ns", UID, spec)
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    return {o["kind"]: o for o in objs}


def test_pod_labels_and_annotations_go_on_every_pod_under_the_operators():
    given = {
        "labels": {"team": "payments", "app.kubernetes.io/part-of": "ledger"},
        "annotations": {"sidecar.istio.io/inject": "false", "cost-center": "42"},
    }
    meta = pod_of({"template": {"pod": {"metadata": given}}})["metadata"]
    assert meta["labels"]["team"] == "payments"
    assert meta["labels"]["app.kubernetes.io/part-of"] == "ledger"
    assert meta["labels"]["app.kubernetes.io/instance"] == "ev"  # the selector's, kept
    assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
    assert CONFIG_HASH in meta["annotations"]


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ({"pod": {"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}}}, "labels"),
        ({"pod": {"metadata": {"annotations": {"streams.pyds.dev/fenced": "true"}}}}, "fenced"),
        ({"serviceAccount": {"metadata": {"labels": {"streams.pyds.dev/role": "p"}}}}, "role"),
    ],
)
def test_the_operators_own_labels_and_annotations_are_refused(template, said):
    problem = refused_change(None, {"template": template})
    assert problem is not None and said in problem and "is the operator's" in problem


def test_a_single_server_gets_its_own_annotated_account_for_irsa():
    """IRSA's webhook and GKE's metadata server find the role through the pod's
    ServiceAccount: a single server ran as the namespace's default account, which a
    platform team cannot annotate for one DurableStream."""
    objs = kinds({"backup": BACKUP, "template": IRSA})
    account = objs["ServiceAccount"]
    assert account["metadata"]["name"] == "ev"
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": ROLE_ARN}
    assert "Role" not in objs  # a single server still calls no API
    pod = objs["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ev"
    assert pod["automountServiceAccountToken"] is False
    # Without it, as before: no account, the namespace's default, no token.
    plain = kinds({"backup": BACKUP})
    assert "ServiceAccount" not in plain
    assert "serviceAccountName" not in plain["StatefulSet"]["spec"]["template"]["spec"]


def test_a_replica_sets_account_carries_the_annotations_and_keeps_its_token():
    objs = kinds({"replicas": 3, "template": IRSA})
    account = objs["ServiceAccount"]
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == ROLE_ARN
    assert account["metadata"]["labels"]["app.kubernetes.io/instance"] == "ev"
    assert account["automountServiceAccountToken"] is True
    assert objs["RoleBinding"]["subjects"][0]["name"] == "ev"


def test_a_replica_set_prefers_other_nodes_then_zones_unless_an_affinity_is_given():
    affinity = pod_of({"replicas": 3})["spec"]["affinity"]
    terms = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["weight"], t["podAffinityTerm"]["topologyKey"]) for t in terms] == [
        (100, "kubernetes.io/hostname"),
        (50, "topology.kubernetes.io/zone"),
    ]
    for t in terms:  # its own set's pods, not every durable-streams pod
        assert t["podAffinityTerm"]["labelSelector"] == {"matchLabels": selector("ev")}
    assert "required" not in str(affinity)  # soft: one node still takes the whole set
    # A given affinity is the whole affinity: nothing of the default merged in.
    given = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
                ]
            }
        }
    }
    pod = pod_of({"replicas": 3, "scheduling": {"affinity": given}})["spec"]
    assert pod["affinity"] == given
    # One server has no peers to keep away from (and rolls for nothing on an upgrade).
    assert "affinity" not in pod_of({})["spec"]


def test_scheduling_fields_reach_the_pod_as_given():
    scheduling = {
        "nodeSelector": {"pool": "streams"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "streams"}],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector("ev")},
            }
        ],
        "priorityClassName": "streams-critical",
    }
    pod = pod_of({"replicas": 3, "scheduling": scheduling})["spec"]
    for key, value in scheduling.items():
        assert pod[key] == value


def test_security_contexts_given_replace_the_operators_whole():
    pod_context = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container_context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    template = {
        "pod": {"securityContext": pod_context},
        "serverContainer": {"securityContext": container_context},
    }
    pod = pod_of({"template": template})["spec"]
    assert pod["securityContext"] == pod_context
    assert pod["containers"][0]["securityContext"] == container_context
    default = pod_of({})["spec"]
    assert default["securityContext"]["runAsUser"] == 10001
    assert default["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_where_the_platform_assigns_the_uid_the_default_names_none(settings):
    """OpenShift's restricted SCC gives each namespace a UID range and refuses a pod that
    asks for 10001 outside it; DS_OPERATOR_SERVER_FIXED_UID=false (the chart's
    server.fixedUID) leaves the UID, group and fsGroup to the platform."""
    operator_settings.load({"DS_OPERATOR_SERVER_FIXED_UID": "false"})
    context = pod_of({"replicas": 3})["spec"]["securityContext"]
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context)
    assert context["runAsNonRoot"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    with pytest.raises(operator_settings.SettingError, match="FIXED_UID"):
        operator_settings.load({"DS_OPERATOR_SERVER_FIXED_UID": "maybe"})


def test_the_analytics_pods_leave_the_uid_to_the_platform_too(settings):
    """spec.analytics' Spark driver and executors run in the same namespace, under the
    same SCC: a fixed UID there is refused as the servers' was."""
    from stream_operator.specs import analytics, spark_manifests

    spec = {**spark_manifests.EXAMPLE_SPEC, "replicas": 3}
    fixed = analytics.render_pod_template("ev", 0, spec, "stats")["spec"]["securityContext"]
    assert fixed["runAsUser"] == analytics.SPARK_UID
    operator_settings.load({"DS_OPERATOR_SERVER_FIXED_UID": "false"})
    for context in (
        analytics.render_pod_template("ev", 0, spec, "stats")["spec"]["securityContext"],
        analytics.pod_security_context(),
    ):
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context)
        assert context["runAsNonRoot"] is True
