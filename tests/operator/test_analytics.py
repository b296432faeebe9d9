"""Spark on Kubernetes: rendered objects and manifests against the published CRD schemas.

One module over 400 lines, kept whole: every check of the Spark objects against the
same published CRD schemas, over the same render fixtures.

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
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from stream_operator import KIND
from stream_operator.specs import analytics as k8s
from stream_operator.specs import spark_manifests as manifests
from testkit import needs, wait_for
from testkit.kube import durable_stream

pytestmark = pytest.mark.processes

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
    render = needs.module("stream_operator.specs.render", install="the operator extra: make deps")
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
            f"{name} is stale: python -m stream_operator.specs.spark_manifests manifests/spark"
        )
        for obj in yaml.safe_load_all(text):
            check(obj)
            kinds.add(obj["kind"])
    assert {"SparkApplication", "ScheduledSparkApplication", "VolumeSnapshot", "Pod"} <= kinds


# --- Safety: selectors, RBAC, pod security, what a DurableStream's editor may ask for ---


def matches(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (a Service's map, or matchLabels/matchExpressions)."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return True  # an empty LabelSelector selects everything
    for key, value in (selector.get("matchLabels") or {}).items():
        if pod_labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in pod_labels and pod_labels[key] in values,
            "NotIn": pod_labels.get(key) not in values,
            "Exists": key in pod_labels,
            "DoesNotExist": key not in pod_labels,
        }[op]
        if not ok:
            return False
    return True


def server_pod_selectors(name: str, spec: dict) -> dict[str, dict]:
    """Every selector over pods among the objects the operator renders for the servers."""
    render = needs.module("stream_operator.specs.render", install="the operator extra: make deps")
    out = {}
    for obj in render.desired_objects(name, "prod", "uid-1", spec, podmonitor_crd=True):
        kind, spec_ = obj["kind"], obj.get("spec") or {}
        if kind == "Service" and spec_.get("selector"):
            out[f"Service {obj['metadata']['name']}"] = spec_["selector"]
        elif kind in ("PodDisruptionBudget", "StatefulSet", "PodMonitor"):
            out[f"{kind} {obj['metadata']['name']}"] = spec_["selector"]
    return out


def spark_pod_labels(app: dict) -> dict[str, dict[str, str]]:
    """The labels of the pods a (Scheduled)SparkApplication makes, as the Spark Operator
    labels them: the application's labels (a ScheduledSparkApplication's are copied onto
    each run), then the role's own, then Spark's."""
    spec = app["spec"].get("template") or app["spec"]
    run = app["metadata"]["name"] + "-1700000000"
    out = {}
    for role in ("driver", "executor"):
        out[f"{app['metadata']['name']} {role}"] = {
            **app["metadata"]["labels"],
            **spec[role].get("labels", {}),
            "spark-role": role,
            "spark-app-selector": "spark-0123",
            "sparkoperator.k8s.io/app-name": run,
        }
    return out


def test_spark_pods_are_outside_the_servers_selectors():
    """A Spark pod under the server's PodDisruptionBudget blocks node drains; under its
    Services it gets client traffic. Neither may select one."""
    spec = {**manifests.EXAMPLE_SPEC, "replicas": 2}
    selectors = server_pod_selectors("events", spec)
    assert {"PodDisruptionBudget events", "Service events", "StatefulSet events"} <= set(selectors)
    render = needs.module("stream_operator.specs.render", install="the operator extra: make deps")
    server_pod = render.render_statefulset("events", "prod", "uid-1", spec)["spec"]["template"]
    # The check can fail: it sees the servers, as labelled at run time (a replica set's
    # pods also carry the role the operator gives them from the Lease; Spark pods never).
    server_labels = server_pod["metadata"]["labels"]
    as_running = [{**server_labels, render.ROLE: role} for role in (render.PRIMARY, render.STANDBY)]
    for where, selector in selectors.items():
        assert any(matches(selector, labels) for labels in as_running), where
    pods: dict[str, dict[str, str]] = {}
    for app in k8s.render_scheduled_applications("events", "prod", "uid-1", spec):
        pods |= spark_pod_labels(app)
    pods |= spark_pod_labels(
        k8s.render_application("events", "prod", "u", spec, replica=1, job="stats", run="now")
    )
    template = k8s.render_pod_template("events", 0, spec, "stats")
    pods["pod template"] = template["metadata"]["labels"]
    for obj in manifests.snapshot_objects():
        if obj["kind"] == "SparkApplication":
            pods |= spark_pod_labels(obj)
    selected = [
        f"{where} selects {pod}"
        for where, selector in selectors.items()
        for pod, labels in pods.items()
        if matches(selector, labels)
    ]
    assert selected == []
    for labels in pods.values():
        assert labels["app.kubernetes.io/component"] == "analytics"
    # Co-scheduling still finds the server pod, and only it.
    (obj, *_) = k8s.render_scheduled_applications("events", "prod", "uid-1", spec)
    term = obj["spec"]["template"]["driver"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ][0]["labelSelector"]
    first_server = {
        **server_pod["metadata"]["labels"],
        "statefulset.kubernetes.io/pod-name": "events-0",
    }
    assert matches(term, first_server)
    assert not any(matches(term, labels) for labels in pods.values())


CHART = ROOT / "charts" / "durable-streams"


@pytest.fixture(scope="module")
def helm() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    from get_tools import ensure

    return str(ensure() / "helm")


def helm_template(helm: str, *sets: str) -> list[dict]:
    args = [helm, "template", "rel", str(CHART), "--namespace", "ds"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


# What the Spark driver may do, at most (verbs per core resource); a test fails if a
# Role grants more. Volumes: nothing, so a job can never delete a server's data.
DRIVER_MAY = {
    "pods": {"get", "list", "watch", "create", "patch", "delete", "deletecollection"},
    "services": {"get", "list", "watch", "create", "delete", "deletecollection"},
    "configmaps": {"get", "list", "watch", "create", "delete", "deletecollection"},
}


def granted(role: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""], rule
        for resource in rule["resources"]:
            out.setdefault(resource, set()).update(rule["verbs"])
    return out


def test_the_spark_driver_role_grants_nothing_on_volumes(helm):
    """Jobs mount existing claims by name (no right needed): the driver's account must not
    be able to delete (or even list) the servers' PersistentVolumeClaims."""
    docs = helm_template(
        helm, "sparkServiceAccount.create=true", "sparkServiceAccount.namespaces={a}"
    )
    chart_role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "a")
    plain_role = next(d for d in manifests.rbac() if d["kind"] == "Role")
    for role in (chart_role, plain_role):
        rights = granted(role)
        assert "persistentvolumeclaims" not in rights and "*" not in rights
        assert rights.keys() == DRIVER_MAY.keys()
        for resource, verbs in rights.items():
            assert verbs <= DRIVER_MAY[resource], (resource, verbs - DRIVER_MAY[resource])
        # What Spark needs to run executors at all.
        assert {"create", "get", "watch", "delete"} <= rights["pods"]
        assert "create" in rights["configmaps"]
    assert granted(chart_role) == granted(plain_role)


# The Pod Security Standards' "restricted" profile (which includes "baseline"), as
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ states it.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(pod: dict) -> list[str]:
    """What keeps ``pod`` out of a namespace labelled
    ``pod-security.kubernetes.io/enforce: restricted`` (empty: admitted)."""
    spec = pod["spec"]
    psc = spec.get("securityContext") or {}
    containers = [
        (kind, c)
        for kind in ("initContainers", "containers", "ephemeralContainers")
        for c in spec.get(kind) or []
    ]
    out: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"{field}")
    for vol in spec.get("volumes") or []:
        kind = next(k for k in vol if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']} is {kind}")
    for sysctl in psc.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl['name']}")
    for key, value in (pod.get("metadata", {}).get("annotations") or {}).items():
        apparmor = key.startswith("container.apparmor.security.beta.kubernetes.io/")
        if apparmor and value != "runtime/default" and not value.startswith("localhost/"):
            out.append(f"AppArmor {value}")

    def common(where: str, sc: dict) -> None:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: hostProcess")
        if (sc.get("appArmorProfile") or {}).get("type", "RuntimeDefault") not in (
            "RuntimeDefault",
            "Localhost",
        ):
            out.append(f"{where}: appArmorProfile")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"{where}: seLinuxOptions")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser 0")
        if sc.get("runAsNonRoot") is False:
            out.append(f"{where}: runAsNonRoot false")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile {seccomp}")

    common("pod", psc)
    for kind, c in containers:
        where = f"{kind} {c['name']}"
        sc = c.get("securityContext") or {}
        common(where, sc)
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}: procMount")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: capabilities must drop ALL")
        added = set(caps.get("add") or [])
        if added - {"NET_BIND_SERVICE"} or added - BASELINE_CAPABILITIES:
            out.append(f"{where}: adds capabilities {sorted(added)}")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{where}: hostPort")
        if psc.get("runAsNonRoot") is not True and sc.get("runAsNonRoot") is not True:
            out.append(f"{where}: runAsNonRoot must be true (pod or container)")
        seccomp_set = (psc.get("seccompProfile") or {}).get("type") or (
            sc.get("seccompProfile") or {}
        ).get("type")
        if seccomp_set not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
    return out


def spark_pods(app: dict) -> dict[str, dict]:
    """The driver and executor pods of a (Scheduled)SparkApplication, as the Spark Operator's
    webhook and Spark make them: podSecurityContext on the pod, securityContext on the Spark
    container, the role's init containers and mounted volumes, Spark's own config map and
    scratch space."""
    spec = app["spec"].get("template") or app["spec"]
    out = {}
    for role in ("driver", "executor"):
        r = spec[role]
        mounted = {m["name"] for m in r.get("volumeMounts", [])}
        mounted |= {m["name"] for c in r.get("initContainers", []) for m in c["volumeMounts"]}
        pod_spec: dict[str, Any] = {
            "containers": [
                {
                    "name": f"spark-kubernetes-{role}",
                    "image": spec["image"],
                    "securityContext": r.get("securityContext"),
                    "ports": [{"containerPort": 7078}],
                    "volumeMounts": r.get("volumeMounts", []),
                }
            ],
            "volumes": [v for v in spec.get("volumes", []) if v["name"] in mounted]
            + [
                {"name": "spark-conf-volume", "configMap": {"name": "conf"}},
                {"name": "spark-local-dir-1", "emptyDir": {}},
            ],
        }
        for key, field in [
            ("podSecurityContext", "securityContext"),
            ("initContainers", "initContainers"),
            ("hostNetwork", "hostNetwork"),
        ]:
            if key in r:
                pod_spec[field] = r[key]
        out[f"{app['metadata']['name']} {role}"] = {
            "metadata": {"annotations": r.get("annotations", {})},
            "spec": pod_spec,
        }
    return out


def test_the_restricted_checker_can_fail():
    loose = {
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 185},
            "hostNetwork": True,
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [
                {"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}
            ],
        }
    }
    found = restricted_violations(loose)
    for part in (
        "hostNetwork",
        "hostPath",
        "allowPrivilegeEscalation",
        "drop ALL",
        "SYS_ADMIN",
        "seccomp",
    ):
        assert any(part in v for v in found), (part, found)
    tight = {
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "c",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                    },
                }
            ],
        }
    }
    assert restricted_violations(tight) == []
    tight["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    assert restricted_violations(tight) == ["containers c: runAsUser 0"]


def test_spark_pods_meet_the_restricted_pod_security_profile():
    """A namespace with PodSecurity ``restricted`` (where stream servers can run) must admit
    every pod a job makes: driver, executors, the snapshot job's init container, and the
    spark-submit form's pod template."""
    pods: dict[str, dict] = {}
    spec = {**manifests.EXAMPLE_SPEC, "replicas": 2}
    for app in k8s.render_scheduled_applications("events", "prod", "uid-1", spec):
        pods |= spark_pods(app)
    claim = {**spec["analytics"], "volumeAccess": "claim", "claimName": "c-{replica}"}
    for app in k8s.render_scheduled_applications("e", "ns", "u", {"analytics": claim}):
        pods |= spark_pods(app)
    for objects in manifests.files().values():
        for obj in objects:
            if obj["kind"] in ("SparkApplication", "ScheduledSparkApplication"):
                pods |= spark_pods(obj)
            elif obj["kind"] == "Pod":
                pods[f"pod template {obj['metadata']['labels']['streams.pyds.dev/job']}"] = obj
    assert any("snapshot" in name for name in pods)  # with its init container
    violations = {
        name: found for name, pod in pods.items() if (found := restricted_violations(pod))
    }
    assert violations == {}


def test_what_a_durable_streams_editor_may_not_choose():
    """sparkConf cannot pick the image, the account, the pods' shape, their mounts or the
    master; the driver's account is one the operator allows. Refusals name the key."""
    base = {**manifests.EXAMPLE_SPEC["analytics"]}
    refused = [
        "spark.kubernetes.container.image",
        "spark.kubernetes.executor.container.image",
        "spark.kubernetes.container.image.pullSecrets",
        "spark.kubernetes.authenticate.driver.serviceAccountName",
        "spark.kubernetes.authenticate.executor.serviceAccountName",
        "spark.kubernetes.authenticate.submission.oauthToken",
        "spark.kubernetes.driver.podTemplateFile",
        "spark.kubernetes.executor.podTemplateContainerName",
        "spark.kubernetes.driver.volumes.hostPath.root.mount.path",
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.x.options.claimName",
        "spark.kubernetes.driver.secrets.db-password",
        "spark.kubernetes.executor.secretKeyRef.TOKEN",
        "spark.kubernetes.driver.label.app.kubernetes.io/name",
        "spark.kubernetes.driver.annotation.container.apparmor.security.beta.kubernetes.io/x",
        "spark.kubernetes.driver.pod.featureSteps",
        "spark.kubernetes.kerberos.tokenSecret.name",
        "spark.kubernetes.namespace",
        "spark.master",
        "spark.kubernetes.driver.master",
        "Spark.Kubernetes.Container.Image",
    ]
    for key in refused:
        analytics = {**base, "sparkConf": {"spark.sql.shuffle.partitions": "4", key: "x"}}
        with pytest.raises(k8s.AnalyticsNotAllowed, match=re.escape(key)):
            k8s.render_scheduled_applications("e", "ns", "u", {"analytics": analytics})
    fine = {
        "spark.sql.shuffle.partitions": "4",
        "spark.executor.memoryOverhead": "512m",
        "spark.kubernetes.node.selector.pool": "analytics",
        "spark.kubernetes.driver.annotation.sidecar.istio.io/inject": "false",
        "spark.kubernetes.executor.deleteOnTermination": "true",
    }
    (obj, _) = k8s.render_scheduled_applications(
        "e", "ns", "u", {"analytics": {**base, "sparkConf": fine}}
    )
    assert fine.items() <= obj["spec"]["template"]["sparkConf"].items()

    # The account: the operator's own by default, others only from its allow-list.
    assert obj["spec"]["template"]["driver"]["serviceAccount"] == "spark"
    other = {"analytics": {**base, "serviceAccount": "default"}}
    with pytest.raises(k8s.AnalyticsNotAllowed, match="'default' is not allowed"):
        k8s.render_scheduled_applications("e", "ns", "u", other)
    with pytest.raises(k8s.AnalyticsNotAllowed):
        manifests.k8s.spark_submit_argv(
            "e", "ns", other, replica=0, job="stats", api_server="https://k", pod_template="p"
        )
    allowed = k8s.allowed_service_accounts({k8s.SERVICE_ACCOUNTS_ENV: " etl, default ,etl"})
    assert allowed == ("etl", "default")
    (obj, _) = k8s.render_scheduled_applications("e", "ns", "u", other, service_accounts=allowed)
    assert obj["spec"]["template"]["driver"]["serviceAccount"] == "default"
    (obj, _) = k8s.render_scheduled_applications(
        "e", "ns", "u", {"analytics": base}, service_accounts=allowed
    )
    assert obj["spec"]["template"]["driver"]["serviceAccount"] == "etl"
    assert k8s.allowed_service_accounts({}) == ("spark",)


def test_the_chart_tells_the_operator_which_accounts_it_may_use(helm):
    for sets, want in [
        ((), "spark"),
        (("sparkServiceAccount.name=analytics",), "analytics"),
        (
            ("sparkServiceAccount.allowed={etl,spark-operator-spark}",),
            "spark,etl,spark-operator-spark",
        ),
    ]:
        deployment = next(d for d in helm_template(helm, *sets) if d["kind"] == "Deployment")
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": k8s.SERVICE_ACCOUNTS_ENV, "value": want} in env, env


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch):
    """The real operator (kopf) against the emulated API server, with the Spark Operator's
    CRD; the operator allows the accounts ``spark`` (its own) and ``etl``."""
    needs.module("kopf", install="the operator extra: make deps")
    from testkit.cluster import cluster
    from testkit.operator import running_operator

    monkeypatch.setenv(k8s.SERVICE_ACCOUNTS_ENV, "spark,etl")
    with cluster() as c:
        c.install_spark_operator_crd()
        with running_operator(c):
            yield c


def test_the_operator_refuses_what_an_editor_may_not_choose(kube):
    """Status says why (Analytics=False, InvalidAnalytics, the key or the account), and the
    jobs already scheduled stay exactly as they were."""

    def analytics() -> dict[str, Any]:
        obj = kube.get(KIND, "default", "events") or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Analytics"), {})

    def scheduled() -> dict[str, dict]:
        return {o["metadata"]["name"]: o for o in kube.list("ScheduledSparkApplication", "default")}

    base = {
        **manifests.EXAMPLE_SPEC["analytics"],
        "jobs": [{"name": "stats", "type": "stream-stats"}],
    }
    kube.create(durable_stream("events", {"analytics": base})).raise_for_status()
    wait_for(lambda: analytics().get("reason") == "Scheduled", message="Analytics=True")
    (app,) = scheduled().values()
    assert app["spec"]["template"]["driver"]["serviceAccount"] == "spark"
    assert app["metadata"]["labels"]["app.kubernetes.io/name"] == k8s.ANALYTICS_APP
    version = app["metadata"]["resourceVersion"]

    for change, says in [
        (
            {"sparkConf": {"spark.kubernetes.container.image": "evil:1"}},
            "spark.kubernetes.container.image",
        ),
        ({"serviceAccount": "default"}, "'default' is not allowed"),
        (
            {"sparkConf": {"spark.kubernetes.driver.volumes.hostPath.r.mount.path": "/host"}},
            "volumes",
        ),
    ]:
        kube.patch(KIND, "default", "events", {"spec": {"analytics": change}}).raise_for_status()
        wait_for(lambda s=says: s in analytics().get("message", ""), message=says)
        cond = analytics()
        assert (cond["status"], cond["reason"]) == ("False", "InvalidAnalytics")
        assert scheduled()["events-0-stats"]["metadata"]["resourceVersion"] == version
        kube.patch(
            KIND,
            "default",
            "events",
            # A merge patch: null removes the key.
            {"spec": {"analytics": {"sparkConf": None, "serviceAccount": None}}},
        ).raise_for_status()
        wait_for(lambda: analytics().get("reason") == "Scheduled", message="Scheduled again")

    # An account the operator's allow-list names is used.
    kube.patch(KIND, "default", "events", {"spec": {"analytics": {"serviceAccount": "etl"}}})
    wait_for(
        lambda: (
            scheduled()["events-0-stats"]["spec"]["template"]["driver"]["serviceAccount"] == "etl"
        ),
        message="the driver runs as etl",
    )
    assert analytics()["reason"] == "Scheduled"
