"""Spark on Kubernetes: rendered objects and manifests against the published CRD schemas.

No cluster and no Spark here: SparkApplication, ScheduledSparkApplication and
VolumeSnapshot objects are validated with jsonschema against the Spark
Operator's and the CSI snapshotter's own CRD schemas (tests/operator/crds/),
plus a strict check that every field we set exists in those schemas (the API
server would silently prune unknown ones); built-in kinds go through
kubernetes-validate --strict.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from stream_operator import analytics as k8s
from stream_operator import spark_manifests as manifests
from testkit import needs

ROOT = Path(__file__).resolve().parents[2]
CRDS = Path(__file__).parent / "crds"
K8S_VERSION = "1.31"
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

SCHEMAS = {
    "SparkApplication": "sparkapplications.json",
    "ScheduledSparkApplication": "scheduledsparkapplications.json",
    "VolumeSnapshot": "volumesnapshots.json",
}


def crd_schema(kind: str) -> dict:
    return json.loads((CRDS / SCHEMAS[kind]).read_text())


def unknown_fields(obj: Any, schema: dict, path: str = "") -> list[str]:
    """Fields of ``obj`` that ``schema`` does not declare (what pruning would drop)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: list[str] = []
        for key, value in obj.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None or extra is False:
                out.append(f"{path}.{key}")
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [
            p for i, v in enumerate(obj) for p in unknown_fields(v, schema["items"], f"{path}[{i}]")
        ]
    return []


def check_custom(obj: dict) -> None:
    crd = crd_schema(obj["kind"])
    assert obj["apiVersion"] == f"{crd['group']}/{crd['version']}"
    schema = crd["openAPIV3Schema"]
    jsonschema.Draft7Validator(schema).validate(obj)
    assert unknown_fields(obj, schema) == []
    meta = obj["metadata"]
    assert DNS_1123.match(meta["name"]) and len(meta["name"]) <= 63


def check_builtin(obj: dict) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def check(obj: dict) -> None:
    if obj["kind"] in SCHEMAS:
        check_custom(obj)
    else:
        check_builtin(obj)


def test_unknown_field_check_can_fail():
    app = k8s.render_application(
        "s", "ns", "u", manifests.EXAMPLE_SPEC, replica=0, job="stats", run="r"
    )
    app["spec"]["driver"]["volumeMount"] = []  # a typo the API server would silently drop
    assert unknown_fields(app, crd_schema("SparkApplication")["openAPIV3Schema"]) == [
        ".spec.driver.volumeMount"
    ]
    app["spec"]["driver"].pop("volumeMount")
    app["spec"]["type"] = "Pyhton"
    with pytest.raises(jsonschema.ValidationError):
        check_custom(app)


def test_scheduled_applications_per_replica_and_job():
    spec = {**manifests.EXAMPLE_SPEC, "replicas": 3}
    objs = k8s.render_scheduled_applications("events", "prod", "uid-1", spec)
    assert len(objs) == 3 * 2
    assert len({o["metadata"]["name"] for o in objs}) == len(objs)
    for obj in objs:
        check(obj)
        replica = int(obj["metadata"]["labels"]["streams.pyds.dev/replica"])
        template = obj["spec"]["template"]
        assert obj["spec"]["schedule"] == "@hourly"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        data = template["volumes"][0]
        assert data == {
            "name": "data",
            "persistentVolumeClaim": {"claimName": f"data-events-{replica}", "readOnly": True},
        }
        for role in ("driver", "executor"):
            assert {"name": "data", "mountPath": "/data", "readOnly": True} in template[role][
                "volumeMounts"
            ]
            term = template[role]["affinity"]["podAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ][0]
            assert term["topologyKey"] == "kubernetes.io/hostname"
            assert term["labelSelector"]["matchLabels"]["statefulset.kubernetes.io/pod-name"] == (
                f"events-{replica}"
            )
        assert template["arguments"][:3] == [
            "/data",
            "--out",
            f"/output/events-{replica}/{obj['metadata']['labels']['streams.pyds.dev/job']}",
        ]


def test_coscheduling_matches_the_operators_statefulset():
    """The affinity selects the server pod the operator renders; the claim is its PVC."""
    render = needs.module("stream_operator.render", install="the operator extra: make deps")
    sts = render.render_statefulset("events", "prod", "uid-1", {"replicas": 2})
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    claim_template = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    for obj in k8s.render_scheduled_applications(
        "events", "prod", "uid-1", manifests.EXAMPLE_SPEC | {"replicas": 2}
    ):
        replica = obj["metadata"]["labels"]["streams.pyds.dev/replica"]
        template = obj["spec"]["template"]
        selector = template["driver"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ][0]["labelSelector"]["matchLabels"]
        # StatefulSet pods carry their template labels plus the controller's pod-name label.
        actual = {
            **pod_labels,
            "statefulset.kubernetes.io/pod-name": f"{sts['metadata']['name']}-{replica}",
        }
        assert selector.items() <= actual.items()
        claim = template["volumes"][0]["persistentVolumeClaim"]["claimName"]
        assert claim == f"{claim_template}-{sts['metadata']['name']}-{replica}"


def test_analytics_spec_rules():
    schema = k8s.ANALYTICS_SCHEMA
    jsonschema.Draft7Validator(schema).validate(manifests.EXAMPLE_SPEC["analytics"])
    assert k8s.render_scheduled_applications("e", "ns", "u", {"replicas": 2}) == []
    claim = {
        **manifests.EXAMPLE_SPEC["analytics"],
        "volumeAccess": "claim",
        "claimName": "snap-{replica}",
    }
    objs = k8s.render_scheduled_applications("e", "ns", "u", {"replicas": 2, "analytics": claim})
    for obj in objs:
        check(obj)
        replica = obj["metadata"]["labels"]["streams.pyds.dev/replica"]
        template = obj["spec"]["template"]
        assert template["volumes"][0]["persistentVolumeClaim"]["claimName"] == f"snap-{replica}"
        assert "affinity" not in template["driver"] and "affinity" not in template["executor"]
    bad = [
        {"enabled": True},  # nowhere to write
        {"enabled": True, "output": {"uri": "s3a://b/p"}, "volumeAccess": "claim"},
        {
            "enabled": True,
            "output": {"uri": "s3a://b/p"},
            "jobs": [{"name": "x", "type": "extract"}],
        },
        {
            "enabled": True,
            "output": {"uri": "s3a://b/p"},
            "jobs": [{"name": "x", "type": "stream-stats"}] * 2,
        },
    ]
    for analytics in bad:
        with pytest.raises(k8s.AnalyticsError):
            k8s.render_scheduled_applications("e", "ns", "u", {"analytics": analytics})
    # Output to object storage: no output volume, paths under the URI.
    uri = {"enabled": True, "output": {"uri": "s3a://bucket/ds/"}}
    (obj,) = k8s.render_scheduled_applications("e", "ns", "u", {"analytics": uri})
    check(obj)
    assert [v["name"] for v in obj["spec"]["template"]["volumes"]] == ["data"]
    assert obj["spec"]["template"]["arguments"][2] == "s3a://bucket/ds/e-0/stats"


def test_long_names_stay_valid_and_distinct():
    name = "a-very-long-durable-stream-name-for-the-analytics-of-orders"
    objs = k8s.render_scheduled_applications(
        name, "ns", "u", {**manifests.EXAMPLE_SPEC, "replicas": 2}
    )
    names = [o["metadata"]["name"] for o in objs]
    assert len(set(names)) == len(names)
    assert all(len(n) <= k8s.NAME_LIMIT and DNS_1123.match(n) for n in names)


def test_spark_submit_equivalent():
    argv = manifests.submit_command()
    assert argv[:3] == ["spark-submit", "--master", "k8s://https://kubernetes.default.svc:443"]
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    app = k8s.render_application(
        "events", "default", "u", manifests.EXAMPLE_SPEC, replica=0, job="stats", run="once"
    )["spec"]
    assert confs["spark.kubernetes.container.image"] == app["image"]
    for role in ("driver", "executor"):
        prefix = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim.data"
        assert confs[f"{prefix}.options.claimName"] == "data-events-0"
        assert confs[f"{prefix}.mount.readOnly"] == "true"
        assert (
            confs[f"spark.kubernetes.{role}.podTemplateFile"] == "manifests/spark/pod-template.yaml"
        )
    tail = argv[argv.index(app["mainApplicationFile"]) :]
    assert tail == [app["mainApplicationFile"], *app["arguments"]]
    template = k8s.render_pod_template("events", 0, manifests.EXAMPLE_SPEC, "stats")
    check(template)
    assert template["spec"]["affinity"] == app["driver"]["affinity"]


def test_manifests_are_generated_and_valid():
    out = ROOT / "manifests" / "spark"
    files = manifests.files()
    assert sorted(p.name for p in out.glob("*.yaml")) == sorted(files)
    kinds = set()
    for name, objects in files.items():
        text = (out / name).read_text()
        assert text == manifests.render_file(objects), (
            f"{name} is stale: python -m stream_operator.spark_manifests manifests/spark"
        )
        for obj in yaml.safe_load_all(text):
            check(obj)
            kinds.add(obj["kind"])
    assert {"SparkApplication", "ScheduledSparkApplication", "VolumeSnapshot", "Pod"} <= kinds
