"""The chart and the plain manifests, checked with real helm and the official schemas.

One module although long: every check of what helm renders from the one chart, over
the same helm binary and schema helpers."""

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

pytestmark = pytest.mark.processes

K8S_VERSION = "1.31"


@pytest.fixture(scope="module")
def helm() -> str:
    return str(ensure() / "helm")


def template(helm: str, *sets: str) -> list[dict]:
    args = [helm, "template", "rel", str(CHART), "--namespace", "ds"]
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
    crd = yaml.safe_load((CHART / "files" / "crds" / "durablestreams.yaml").read_text())
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
            "operator.metrics.serviceMonitor.enabled=true",
            "operator.leaderElection.enabled=false",
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
    custom = ("DurableStream", "PrometheusRule", "ServiceMonitor")
    validate([d for d in docs if d["kind"] not in custom])
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
    crd = yaml.safe_load((CHART / "files" / "crds" / "durablestreams.yaml").read_text())
    assert crd["spec"]["names"]["shortNames"][0] == "dstream"  # "ds" is DaemonSet
    columns = {c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Phase", "Ready", "Endpoint", "Age"} <= columns


def test_crd_analytics_schema_is_the_spark_renderers():
    """spec.analytics in the CRD is exactly what stream_operator.specs.analytics renders from."""
    from stream_operator.specs.analytics import ANALYTICS_SCHEMA

    analytics = dict(crd_schema()["properties"]["spec"]["properties"]["analytics"])
    analytics.pop("description")
    assert analytics == ANALYTICS_SCHEMA


def test_the_values_of_development_builds_are_refused(helm):
    """operator.serviceMonitorLabels and operator.resyncIntervalSeconds (now
    podMonitorLabels and tuning.resyncIntervalSeconds) are refused by name, not ignored."""
    for value, name in [
        ("operator.serviceMonitorLabels.release=prom", "serviceMonitorLabels"),
        ("operator.resyncIntervalSeconds=15", "resyncIntervalSeconds"),
    ]:
        proc = subprocess.run(
            [helm, "template", "rel", str(CHART), "--set", value],
            capture_output=True,
            text=True,
        )
        assert proc.returncode != 0 and name in proc.stderr


def test_the_unpinned_image_setting_reaches_the_operator(helm):
    """Issue 25: operator.unpinnedServerImage becomes the DS_OPERATOR_UNPINNED_SERVER_IMAGE
    the operator reads (server_image.POLICY_ENV); only roll and hold pass the schema."""
    from stream_operator.decisions.server_image import POLICY_ENV

    for sets, want in [((), "roll"), (("operator.unpinnedServerImage=hold",), "hold")]:
        deployment = next(d for d in template(helm, *sets) if d["kind"] == "Deployment")
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": POLICY_ENV, "value": want} in env
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "--set", "operator.unpinnedServerImage=later"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "unpinnedServerImage" in proc.stderr


def test_the_chart_can_be_a_dependency(helm):
    """Issue 15, finding 8: a parent chart passes ``global`` to every subchart."""
    docs = template(helm, "global.storageClass=fast", "global.imageRegistry=registry.example")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example/durable-streams-operator:0.1.0"


def test_the_chart_declares_the_kubernetes_its_cel_rules_need(helm):
    """Issue 42: the CRD's CEL rules call quantity() (Kubernetes 1.29): an older cluster
    refuses the CRD on install, so the chart says so before anything is applied."""
    assert "quantity(" in (CHART / "files" / "crds" / "durablestreams.yaml").read_text()
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.29.0-0"

    def render(version: str) -> subprocess.CompletedProcess[str]:
        args = [helm, "template", "rel", str(CHART), "--kube-version", version]
        return subprocess.run(args, capture_output=True, text=True)

    old = render("1.28.9")
    assert old.returncode != 0 and "kubeVersion" in old.stderr, old.stderr
    for version in ("1.29.0", "v1.29.3-eks-1234567", "1.33.1"):  # managed clusters' suffixes
        assert render(version).returncode == 0, version


def _operator_pod(helm: str, *sets: str) -> dict:
    docs = template(helm, *sets)
    validate([d for d in docs if d["kind"] == "Deployment"])
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}


def test_images_are_qualified_pinned_and_pulled_with_secrets(helm):
    """Issue 15, finding 8: registry, repository, tag (the chart's version by default),
    optional digest, and imagePullSecrets for the operator and the servers."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pod = _operator_pod(helm)
    assert pod["containers"][0]["image"] == f"durable-streams-operator:{chart['appVersion']}"
    assert _env(pod)["DS_OPERATOR_SERVER_IMAGE"] == f"durable-streams-server:{chart['appVersion']}"
    assert "imagePullSecrets" not in pod
    digest = "sha256:" + "ab" * 32
    pod = _operator_pod(
        helm,
        "operator.image.registry=ghcr.io/acme",
        f"operator.image.digest={digest}",
        "server.image.registry=ghcr.io/acme",
        "server.image.tag=0.2.0",
        "imagePullSecrets[0].name=regcred",
        "global.imagePullSecrets={shared}",
    )
    image = pod["containers"][0]["image"]
    assert image == f"ghcr.io/acme/durable-streams-operator:{chart['appVersion']}@{digest}"
    assert _env(pod)["DS_OPERATOR_SERVER_IMAGE"] == "ghcr.io/acme/durable-streams-server:0.2.0"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "shared"}]
    assert _env(pod)["DS_OPERATOR_SERVER_IMAGE_PULL_SECRETS"] == "regcred,shared"
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "--set", "operator.image.digest=latest"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "digest" in proc.stderr


def test_the_crd_leaves_the_image_to_the_operator():
    """Issue 15, finding 8: a schema default would write today's image into every object,
    and no operator upgrade would ever move those servers."""
    spec = crd_schema()["properties"]["spec"]["properties"]
    assert "default" not in spec["image"]
    assert (CHART / "values.yaml").read_text().count("durable-streams-server:") == 0


def test_crd_lifecycle_defaults_and_ranges():
    """Issue 15, finding 7: probe timings and the grace period, with defaults and ranges."""
    life = crd_schema()["properties"]["spec"]["properties"]["lifecycle"]["properties"]
    assert life["startupTimeoutSeconds"]["default"] == 300
    assert life["terminationGracePeriodSeconds"]["default"] == 30

    def cr(spec: dict) -> dict:
        return {
            "apiVersion": "streams.pyds.dev/v1alpha1",
            "kind": "DurableStream",
            "metadata": {"name": "x"},
            "spec": spec,
        }

    validate_cr(cr({"lifecycle": {"startupTimeoutSeconds": 3600}}))
    validate_cr(cr({"imagePullSecrets": [{"name": "regcred"}]}))
    for bad in (
        {"lifecycle": {"startupTimeoutSeconds": 1}},
        {"lifecycle": {"terminationGracePeriodSeconds": 0}},
        {"lifecycle": {"livenessPeriodSeconds": 0}},
        {"imagePullSecrets": [{}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_cr(cr(bad))


def test_the_crd_is_a_kept_template_that_is_the_crd_file(helm):
    """Issue 25: helm never upgrades crds/, so the CRD is a template (``helm upgrade``
    applies it) with ``helm.sh/resource-policy: keep`` (``helm uninstall`` leaves it and
    every DurableStream); it is exactly the file manifests/crd.yaml is made from, and
    ``crds.install=false`` leaves it to whoever manages CRDs."""
    rendered = [d for d in template(helm) if d["kind"] == "CustomResourceDefinition"]
    assert len(rendered) == 2  # DurableStream, DurableStreamBackup
    assert not (CHART / "crds").exists()  # helm would install it once, never upgrade it
    for crd, manifest in zip(
        rendered,
        [("durablestreams.yaml", "crd.yaml"), ("durablestreambackups.yaml", "crd-backup.yaml")],
        strict=True,
    ):
        crd_text = (CHART / "files" / "crds" / manifest[0]).read_text()
        assert (ROOT / "manifests" / manifest[1]).read_text().endswith(crd_text)
        annotations = crd["metadata"].pop("annotations")
        assert annotations == {"helm.sh/resource-policy": "keep"}
        assert crd == yaml.safe_load(crd_text)
    without = template(helm, "crds.install=false")
    assert not [d for d in without if d["kind"] == "CustomResourceDefinition"]
    upgrades = (ROOT / "docs" / "kubernetes.md").read_text().split("## Upgrades", 1)[1]
    assert "--take-ownership" in upgrades.split("\n## ", 1)[0]


def test_the_example_waits_for_the_crd_on_a_first_install(helm):
    """On ``helm install`` the CRD does not exist when helm maps the release's objects,
    so the example DurableStream is a post-install hook then (with the ownership the
    next upgrade adopts); on an upgrade, an ordinary object of the release."""

    def example(*args: str) -> dict:
        out = subprocess.run(
            [
                helm,
                "template",
                "rel",
                str(CHART),
                "-n",
                "ds",
                "--set",
                "example.enabled=true",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "DurableStream")

    installed = example()["metadata"]
    assert installed["annotations"]["helm.sh/hook"] == "post-install"
    assert installed["annotations"]["meta.helm.sh/release-name"] == "rel"
    assert installed["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert "helm.sh/hook" not in example("--is-upgrade")["metadata"]["annotations"]
    external = example("--set", "crds.install=false")["metadata"]["annotations"]
    assert "helm.sh/hook" not in external
    validate_cr(example())


def test_operator_metrics_leader_election_and_monitoring_labels(helm):
    """Issue 15, findings 9 and 10: what the chart gives the operator and Prometheus."""
    release = "release=kube-prometheus"
    docs = template(
        helm,
        "alerts.enabled=true",
        f"alerts.labels.{release}",
        "operator.metrics.serviceMonitor.enabled=true",
        f"operator.metrics.serviceMonitor.labels.{release}",
        f"operator.podMonitorLabels.{release}",
        "operator.podMonitorLabels.team=streams",
        "operator.replicas=2",
    )
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    deployment = by_kind[("Deployment", "rel-durable-streams")]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    # The PodMonitors' labels.
    assert json.loads(env["DS_OPERATOR_PODMONITOR_LABELS"]) == {
        "release": "kube-prometheus",
        "team": "streams",
    }
    assert env["DS_OPERATOR_LEADER_ELECTION"] == "true"
    assert env["DS_OPERATOR_LEASE_NAME"] == "rel-durable-streams"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert container["ports"] == [{"name": "metrics", "containerPort": 8081}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # Two replicas are safe with the Lease: one acts, the other waits.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    service = by_kind[("Service", "rel-durable-streams-metrics")]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = by_kind[("ServiceMonitor", "rel-durable-streams")]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    rule = by_kind[("PrometheusRule", "rel-durable-streams")]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "DurableStreamReconcileFailing" in alerts
    lease_role = by_kind[("Role", "rel-durable-streams-leader-election")]
    assert lease_role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["rel-durable-streams"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    # Without leader election: no Lease Role, and never two pods at once.
    docs = template(helm, "operator.leaderElection.enabled=false")
    assert not [d for d in docs if d["metadata"]["name"].endswith("leader-election")]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_more_than_one_operator_without_leader_election_is_refused(helm):
    """Issue 25: every replica would act on every object (two active operators)."""
    proc = subprocess.run(
        [
            *(helm, "template", "rel", str(CHART)),
            *("--set", "operator.leaderElection.enabled=false", "--set", "operator.replicas=2"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "operator.replicas=2 with operator.leaderElection.enabled=false" in proc.stderr
    assert "keep operator.replicas=1, or enable leader election" in proc.stderr
    # Either alone is fine: two replicas under the Lease, or one without it.
    for sets in (("operator.replicas=2",), ("operator.leaderElection.enabled=false",)):
        deployment = next(d for d in template(helm, *sets) if d["kind"] == "Deployment")
        assert deployment["spec"]["replicas"] == (2 if "operator.replicas=2" in sets else 1)


def _server_cr(server: dict) -> dict:
    return {
        "apiVersion": "streams.pyds.dev/v1alpha1",
        "kind": "DurableStream",
        "metadata": {"name": "x"},
        "spec": {"server": server},
    }


def test_crd_subscriptions_schema_refuses_what_the_server_would():
    """webhookAllow and publicURL: a malformed value is refused by the API server, not by a
    server pod that crash-loops on DS_WEBHOOK_ALLOW after the rollout began."""
    subs = crd_schema()["properties"]["spec"]["properties"]["server"]["properties"]
    assert "default" not in subs["subscriptions"]  # no roll of existing servers
    validate_cr(
        _server_cr(
            {
                "subscriptions": {
                    "webhookAllow": [
                        "receiver.jobs.svc",
                        "*.workers.svc",
                        "10.244.0.0/16",
                        "10.0.0.7",
                        "fd00::/8",
                        "receiver.jobs.svc.",
                    ],
                    "publicURL": "https://streams.example:8443/prefix",
                }
            }
        )
    )
    validate_cr(_server_cr({"subscriptions": {"publicURL": "http://events.default.svc:4437"}}))
    for bad in (
        {"webhookAllow": ["*"]},
        {"webhookAllow": [""]},
        {"webhookAllow": ["receiver ns"]},
        {"webhookAllow": ["10.0.0.300/8"]},
        {"webhookAllow": ["10.0.0.0/33"]},
        {"webhookAllow": ["10.0.0"]},
        {"webhookAllow": ["*.*.svc"]},
        {"webhookAllow": "receiver.jobs.svc"},
        {"publicURL": "streams.example"},
        {"publicURL": "ftp://streams.example"},
        {"publicURL": "https://user:pw@streams.example"},
        {"publicURL": "https://streams.example/?q=1"},
        {"publicURL": "https://"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_cr(_server_cr({"subscriptions": bad}))


def test_crd_retention_schema_refuses_what_the_server_would():
    """Sizes and ages in the forms the server reads (docs/retention.md), prefixes it can
    tell apart in DS_RETENTION; a rule per entry (CEL) and each prefix once (map keys)."""
    retention = crd_schema()["properties"]["spec"]["properties"]["server"]["properties"][
        "retention"
    ]
    assert "default" not in retention
    assert retention["x-kubernetes-list-type"] == "map"
    assert retention["x-kubernetes-list-map-keys"] == ["prefix"]
    assert retention["items"]["required"] == ["prefix"]
    [cel] = retention["items"]["x-kubernetes-validations"]
    assert cel["rule"] == "has(self.maxBytes) || has(self.maxAge)"
    validate_cr(
        _server_cr(
            {
                "retention": [
                    {"prefix": "logs/", "maxBytes": "10Gi", "maxAge": "7d"},
                    {"prefix": "metrics/", "maxAge": "12h"},
                    {"prefix": "", "maxBytes": "512KiB"},
                    {"prefix": "raw/deep/", "maxBytes": "4096"},
                    {"prefix": "b", "maxBytes": "1TiB", "maxAge": "30s"},
                ]
            }
        )
    )
    for bad in (
        {"maxAge": "1d"},  # no prefix
        {"prefix": "/logs/", "maxAge": "1d"},  # relative to the base path
        {"prefix": "a:b/", "maxAge": "1d"},  # ":" ends the prefix in PREFIX:RULES
        {"prefix": "a;b/", "maxAge": "1d"},  # ";" separates policies
        {"prefix": "a b/", "maxAge": "1d"},
        {"prefix": "logs/", "maxBytes": "10G"},  # the server counts in binary units
        {"prefix": "logs/", "maxBytes": "1.5Gi"},
        {"prefix": "logs/", "maxBytes": "0"},
        {"prefix": "logs/", "maxBytes": "10 Gi"},
        {"prefix": "logs/", "maxAge": "1h30m"},
        {"prefix": "logs/", "maxAge": "0s"},
        {"prefix": "logs/", "maxAge": "7"},
        {"prefix": "logs/", "maxAge": "2w"},
        {"prefix": "logs/", "maxAge": 60},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_cr(_server_cr({"retention": [bad]}))


def test_crd_server_settings_take_the_free_settings_by_flag_name():
    """Issue 42: spec.server.settings takes any value YAML gives (the operator checks it
    against the server's declaration) under the names the operator leaves free, which the
    CEL rule lists: kept equal to stream_operator.api.server_settings.FREE."""
    from stream_operator.api.server_settings import FREE
    from testkit.crd_cel import evaluate

    settings = crd_schema()["properties"]["spec"]["properties"]["server"]["properties"]["settings"]
    (rule,) = settings["x-kubernetes-validations"]
    listed = rule["rule"].split("[", 1)[1].rsplit("]", 1)[0]
    assert sorted(n.strip(" '") for n in listed.split(",")) == sorted(FREE)
    given = {"max-streams": 1000, "keep-alive-timeout": 7.5, "metrics": False}
    validate_cr(_server_cr({"settings": given}))
    assert evaluate(rule, given).passed
    for refused in ({"data-dir": "/x"}, {"long-poll-timeout": 5}, {"max-stream": 1}):
        outcome = evaluate(rule, refused)
        assert not outcome.passed and not outcome.error
        assert "server.settings" in outcome.message


def test_crd_template_takes_pod_and_service_account_metadata_and_security_contexts():
    """Issue 42: spec.template (Strimzi's shape) as the API server checks it."""
    irsa = {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/archive"}
    template = {
        "pod": {
            "metadata": {"labels": {"team": "a"}, "annotations": {"x/y": "z"}},
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        },
        "serverContainer": {"securityContext": {"readOnlyRootFilesystem": True}},
        "serviceAccount": {"metadata": {"annotations": irsa}},
    }
    cr = {**_server_cr({}), "spec": {"template": template}}
    validate_cr(cr)
    for bad in (
        {"pod": {"metadata": {"labels": {"team": 1}}}},
        {"serviceAccount": {"metadata": {"annotations": ["a"]}}},
        {"serverContainer": "restricted"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_cr({**cr, "spec": {"template": bad}})


def test_the_operators_pod_takes_placement_metadata_and_security_contexts(helm):
    """Issue 42: what a platform team sets on the operator's own pod, rendered by helm
    and checked by Kubernetes' schema; given security contexts replace the chart's."""
    sets = (
        "operator.priorityClassName=system-cluster-critical",
        "operator.podLabels.team=platform",
        "operator.podLabels.app\\.kubernetes\\.io/name=not-the-selector",
        "operator.podAnnotations.example\\.com/owner=platform",
        "operator.tolerations[0].key=dedicated",
        "operator.tolerations[0].operator=Exists",
        "operator.topologySpreadConstraints[0].maxSkew=1",
        "operator.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "operator.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "operator.securityContext.allowPrivilegeEscalation=false",
    )
    docs = template(helm, *sets)
    validate([d for d in docs if d["kind"] != "CustomResourceDefinition"])
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "platform"
    # The selector's labels win: another value would orphan the pod from its Deployment.
    assert pod["metadata"]["labels"] == {
        **deployment["spec"]["selector"]["matchLabels"],
        "team": "platform",
    }
    assert pod["metadata"]["annotations"] == {"example.com/owner": "platform"}
    spec = pod["spec"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert spec["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False}
    assert spec["securityContext"]["runAsUser"] == 10001
    assert _env(_operator_pod(helm))["DS_OPERATOR_SERVER_FIXED_UID"] == "true"


def test_on_openshift_no_pod_asks_for_a_uid(helm):
    """fixedUID=false: the restricted SCC assigns the UID; a fixed 10001 outside the
    namespace's range is refused at admission. The operator leaves it out of the servers'
    pods too (DS_OPERATOR_SERVER_FIXED_UID; tests/operator/test_pod_template.py)."""
    pod = _operator_pod(helm, "fixedUID=false")
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(pod["securityContext"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert _env(pod)["DS_OPERATOR_SERVER_FIXED_UID"] == "false"
    given = _operator_pod(helm, "operator.podSecurityContext.runAsNonRoot=true")
    assert given["securityContext"] == {"runAsNonRoot": True}
