"""The chart and the plain manifests, checked with real helm and the official schemas."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from testkit.kube import openapi_as_jsonschema

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "durable-streams"
sys.path.insert(0, str(ROOT / "scripts"))

from get_tools import ensure  # noqa: E402

K8S_VERSION = "1.31"


@pytest.fixture(scope="module")
def helm() -> str:
    return str(ensure() / "helm")


def template(helm: str, *sets: str) -> list[dict]:
    args = [helm, "template", "rel", str(CHART), "--namespace", "ds", "--include-crds"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def validate(docs: list[dict]) -> None:
    """kubernetes-validate --strict on every built-in object (it skips custom resources)."""
    text = yaml.safe_dump_all(docs)
    proc = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", K8S_VERSION, "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def crd_schema() -> dict:
    crd = yaml.safe_load((CHART / "crds" / "durablestreams.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validate_cr(obj: dict) -> None:
    jsonschema.validate(obj, openapi_as_jsonschema(crd_schema()))


def test_helm_lint(helm):
    proc = subprocess.run([helm, "lint", str(CHART), "--strict"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "sets",
    [
        (),
        (
            "alerts.enabled=true",
            "example.enabled=true",
            "operator.watchNamespaces={a,b}",
            "operator.logVerbose=true",
            "serviceAccount.name=custom",
            "sparkServiceAccount.create=true",
            "sparkServiceAccount.namespaces={analytics,default}",
        ),
    ],
    ids=["defaults", "everything"],
)
def test_rendered_chart_validates(helm, sets):
    docs = template(helm, *sets)
    kinds = {d["kind"] for d in docs}
    assert {
        "CustomResourceDefinition",
        "Deployment",
        "ClusterRole",
        "ClusterRoleBinding",
        "ServiceAccount",
        "ConfigMap",
    } <= kinds
    validate([d for d in docs if d["kind"] not in ("DurableStream", "PrometheusRule")])
    for d in docs:
        if d["kind"] == "DurableStream":
            validate_cr(d)
        if d["kind"] == "ConfigMap":
            json.loads(d["data"]["durable-streams.json"])  # the dashboard is valid JSON
        if d["kind"] == "PrometheusRule":
            assert d["spec"]["groups"][0]["rules"]
    if "sparkServiceAccount.create=true" in sets:
        spark = {
            (d["kind"], d["metadata"]["namespace"])
            for d in docs
            if "spark" in d["metadata"]["name"]
        }
        assert spark == {
            (kind, ns)
            for kind in ("ServiceAccount", "Role", "RoleBinding")
            for ns in ("analytics", "default")
        }


def test_values_schema_rejects_bad_values(helm):
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "--set", "operator.image.pullPolicy=Sometimes"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "pullPolicy" in proc.stderr


def test_manifests_are_generated_from_the_chart_and_validate():
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_manifests.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    # manifests/spark/ holds Spark Operator resources: tests/spark validates them
    # against that operator's published schemas.
    for path in sorted(p for p in (ROOT / "manifests").rglob("*.yaml") if "spark" not in p.parts):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        builtin = [d for d in docs if d["kind"] not in ("DurableStream", "PrometheusRule")]
        if builtin:
            validate(builtin)
        for d in docs:
            if d["kind"] == "DurableStream":
                validate_cr(d)


def test_chart_ships_the_current_dashboard_and_alerts():
    obs = ROOT / "observability"
    assert (CHART / "files" / "dashboard.json").read_text() == (
        obs / "grafana" / "durable-streams.json"
    ).read_text()
    assert (CHART / "files" / "alerts.yaml").read_text() == (
        obs / "prometheus" / "alerts.yaml"
    ).read_text()


def test_crd_schema_defaults_ranges_and_immutability():
    schema = crd_schema()["properties"]["spec"]["properties"]
    assert schema["replicas"]["minimum"] == 1
    rules = {r["message"] for r in schema["storage"]["x-kubernetes-validations"]}
    assert rules == {"storageClassName cannot change", "storage size can only grow"}
    validate_cr(
        {
            "apiVersion": "streams.pyds.dev/v1alpha1",
            "kind": "DurableStream",
            "metadata": {"name": "x"},
            "spec": {"replicas": 2, "storage": {"size": "1Gi"}},
        }
    )
    for bad in (
        {"replicas": 0},
        {"storage": {"size": "lots"}},
        {"server": {"logLevel": "loud"}},
        {"service": {"port": 70000}},
        {"storage": {"pvcRetention": "Maybe"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_cr(
                {
                    "apiVersion": "streams.pyds.dev/v1alpha1",
                    "kind": "DurableStream",
                    "metadata": {"name": "x"},
                    "spec": bad,
                }
            )
    crd = yaml.safe_load((CHART / "crds" / "durablestreams.yaml").read_text())
    assert crd["spec"]["names"]["shortNames"][0] == "dstream"  # "ds" is DaemonSet
    columns = {c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Phase", "Ready", "Endpoint", "Age"} <= columns


def test_crd_analytics_schema_is_the_spark_renderers():
    """spec.analytics in the CRD is exactly what stream_operator.analytics renders from."""
    from stream_operator.analytics import ANALYTICS_SCHEMA

    analytics = dict(crd_schema()["properties"]["spec"]["properties"]["analytics"])
    analytics.pop("description")
    assert analytics == ANALYTICS_SCHEMA


def test_the_resync_interval_reaches_the_operator(helm):
    """operator.resyncIntervalSeconds becomes the DS_OPERATOR_RESYNC_INTERVAL it reads."""
    for sets, want in [((), "60"), (("operator.resyncIntervalSeconds=15",), "15")]:
        deployment = next(d for d in template(helm, *sets) if d["kind"] == "Deployment")
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "DS_OPERATOR_RESYNC_INTERVAL", "value": want} in env
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "--set", "operator.resyncIntervalSeconds=0"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "resyncIntervalSeconds" in proc.stderr
