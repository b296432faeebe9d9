"""Spark on Kubernetes for a DurableStream: what ``spec.analytics`` becomes, as plain dicts.

One module over 400 lines, kept whole: every object ``spec.analytics`` becomes is
rendered from the same few settings (image, volume, schedule, snapshot), and the
renderers share them.

Pure functions, like the operator's render module, so the operator can call
them and tests can check them without a cluster:

- ``render_scheduled_applications`` -> one ScheduledSparkApplication (Spark
  Operator, ``sparkoperator.k8s.io/v1beta2``) per server replica and job;
- ``render_application`` -> a one-off SparkApplication;
- ``spark_submit_argv`` and ``render_pod_template`` -> the same job with
  plain ``spark-submit --master k8s://...`` and pod template files.

Why per replica: each server pod is an independent server with its own
ReadWriteOnce volume (PVC ``data-<name>-<i>``). A replica set's pods hold
copies of the same streams: the operator then asks for one replica, an
in-sync standby's (``replicas=[i]``, analytics_source.py), never the primary's. A ReadWriteOnce volume can be
mounted only on the node where it is attached, so a job that reads it live
must run its driver and executors on the server pod's node
(``volumeAccess: coschedule``: required podAffinity on
``kubernetes.io/hostname``) and mounts it read-only; the data source opens
LMDB read-only without locks and reads only committed data. With
``volumeAccess: claim`` the job mounts another claim instead (a VolumeSnapshot
clone made ready with ``python -m stream_server.recover``, or ReadWriteMany
storage), with no affinity. Both the driver (it plans from LMDB) and the
executors (they read segment files) mount the volume.

Safety, because a Spark job shares the server's namespace (it must, to mount
the server's claims):

- Spark pods carry labels of their own (``app.kubernetes.io/name:
  durable-streams-analytics``), never the server's selector: the server's
  PodDisruptionBudget, Services and StatefulSet must not count, route to or
  adopt them. The Spark Operator copies a (Scheduled)SparkApplication's labels
  onto its pods, so the objects' labels follow the same rule.
- Every Spark pod meets the PodSecurity ``restricted`` profile (non-root,
  seccomp RuntimeDefault, no privilege escalation, all capabilities dropped).
- Who can edit a DurableStream chooses the job's image and code, but not whom
  it runs as or what it mounts: the driver's ServiceAccount must be one the
  operator allows (``DS_ANALYTICS_SERVICE_ACCOUNTS``), and ``sparkConf`` keys
  that choose images, credentials, pod templates, volumes, secrets, labels,
  the master or the namespace are refused (``AnalyticsNotAllowed``).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from stream_operator import GROUP, VERSION
from stream_operator.api.spec import SpecInput
from stream_operator.api.spec import with_defaults as parse_spec
from stream_operator.configuration import operator_settings

SPARK_GROUP = "sparkoperator.k8s.io"
SPARK_VERSION_API = "v1beta2"
DS_API_VERSION = f"{GROUP}/{VERSION}"
DS_KIND = "DurableStream"
DATA_MOUNT = "/data"
OUTPUT_MOUNT = "/output"
JOB_FILES = {
    "stream-stats": "local:///opt/stream_spark/jobs/stats.py",
    "extract": "local:///opt/stream_spark/jobs/extract.py",
}
SPARK_UID = 185  # the user and group of the job image (as in Apache Spark's images)
ANALYTICS_APP = "durable-streams-analytics"  # app.kubernetes.io/name of Spark pods
SERVICE_ACCOUNTS_ENV = "DS_ANALYTICS_SERVICE_ACCOUNTS"
DEFAULT_SERVICE_ACCOUNT = "spark"  # the chart's sparkServiceAccount.name
NAME_LIMIT = 40  # the Spark Operator adds "-<10-digit time>", then "-driver" / "-ui-svc"

DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "image": "durable-streams-spark:0.1.0",
    "imagePullPolicy": "IfNotPresent",
    "schedule": "@hourly",
    "suspend": False,
    "concurrencyPolicy": "Forbid",
    "volumeAccess": "coschedule",
    "sparkVersion": "4.3.0",
    "driver": {"cores": 1, "memory": "1g"},
    "executor": {"instances": 1, "cores": 1, "memory": "1g"},
    "sparkConf": {},
    "output": {"claimName": None, "uri": None},
    "jobs": [{"name": "stats", "type": "stream-stats"}],
}

# spec.analytics in the DurableStream CRD (openAPIV3Schema), for the operator's chart.
ANALYTICS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "enabled": {"type": "boolean", "default": False},
        "image": {"type": "string"},
        "imagePullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
        "schedule": {"type": "string", "minLength": 1},
        "timeZone": {"type": "string"},
        "suspend": {"type": "boolean"},
        "concurrencyPolicy": {"type": "string", "enum": ["Allow", "Forbid", "Replace"]},
        "volumeAccess": {"type": "string", "enum": ["coschedule", "claim"]},
        "claimName": {"type": "string"},
        "serviceAccount": {
            "type": "string",
            "description": "The Spark driver's ServiceAccount; only those the operator allows"
            " (DS_ANALYTICS_SERVICE_ACCOUNTS, the chart's sparkServiceAccount), the first by"
            " default.",
        },
        "sparkVersion": {"type": "string"},
        "driver": {
            "type": "object",
            "properties": {
                "cores": {"type": "integer", "minimum": 1},
                "memory": {"type": "string"},
            },
        },
        "executor": {
            "type": "object",
            "properties": {
                "instances": {"type": "integer", "minimum": 1},
                "cores": {"type": "integer", "minimum": 1},
                "memory": {"type": "string"},
            },
        },
        "sparkConf": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Extra Spark properties. Keys that choose images, credentials, pod"
            " templates, volumes, secrets, labels, the master or the namespace are refused.",
        },
        "output": {
            "type": "object",
            "properties": {"claimName": {"type": "string"}, "uri": {"type": "string"}},
        },
        "jobs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "type"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                    "type": {"type": "string", "enum": sorted(JOB_FILES)},
                    "streams": {"type": "string"},
                    "fields": {"type": "array", "items": {"type": "string"}},
                    "args": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


# sparkConf keys that would let a DurableStream's editor step outside the pods the
# operator renders: what the pods run and as whom, where they are created, what they
# mount, and labels that could put them under the server's selectors. Matched
# case-insensitively (Spark's keys are case-sensitive; a near miss is refused anyway).
REFUSED_CONF: tuple[tuple[str, str], ...] = (
    (r"spark\.master|spark\.submit\.deploymode", "the master"),
    (r"spark\.kubernetes\.(driver\.)?master|spark\.kubernetes\.context", "the API server"),
    (r"spark\.kubernetes\.namespace", "the namespace"),
    (r"spark\.kubernetes\.((driver|executor)\.)?container\.image(\..*)?", "the image"),
    (r"spark\.kubernetes\.authenticate\..*", "service accounts and credentials"),
    (r"spark\.kubernetes\.(driver|executor)\.podtemplate.*", "pod templates"),
    (r"spark\.kubernetes\.(driver|executor)\.pod\.(excluded)?featuresteps", "pod features"),
    (r"spark\.kubernetes\.(driver|executor)\.pod\.name", "pod names"),
    (r"spark\.kubernetes\.(driver|executor)\.volumes\..*", "volumes"),
    (r"spark\.kubernetes\.(driver|executor)\.(secrets|secretkeyref)\..*", "secrets"),
    (r"spark\.kubernetes\.kerberos\..*", "secrets"),
    (r"spark\.kubernetes\.hadoop\..*", "config maps"),
    (r"spark\.kubernetes\.(driver|executor)\.label\..*", "pod labels"),
    (r"spark\.kubernetes\.(driver|executor)\.annotation\..*(apparmor|seccomp).*", "security"),
)
_REFUSED = [(re.compile(pattern, re.IGNORECASE), what) for pattern, what in REFUSED_CONF]


class AnalyticsError(ValueError):
    """A spec.analytics the renderer cannot turn into jobs (the reason is the message)."""


class AnalyticsNotAllowed(AnalyticsError):
    """A spec.analytics that asks for more than a DurableStream's editor may grant itself."""


def allowed_service_accounts(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The ServiceAccounts a job's driver may run as, the operator's own first.

    An operator-level setting (``DS_ANALYTICS_SERVICE_ACCOUNTS``, comma-separated;
    the chart sets it from ``sparkServiceAccount``), never the DurableStream's:
    whoever edits one must not pick a more powerful account in its namespace.
    """
    raw = (os.environ if env is None else env).get(SERVICE_ACCOUNTS_ENV, "")
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    return names or (DEFAULT_SERVICE_ACCOUNT,)


def refused_conf_keys(conf: Mapping[str, str]) -> list[str]:
    """The ``sparkConf`` keys a DurableStream may not set, each with what it would choose."""
    out = []
    for key in sorted(conf):
        what = next((w for rx, w in _REFUSED if rx.fullmatch(key.strip())), None)
        if what is not None:
            out.append(f"{key} ({what})")
    return out


def with_defaults(
    analytics: dict[str, Any] | None, service_accounts: Sequence[str] | None = None
) -> dict[str, Any]:
    """spec.analytics with every default filled in (deep, input untouched).

    The driver's ServiceAccount defaults to the operator's own (the first allowed).
    """
    out = copy.deepcopy(DEFAULTS)
    out["serviceAccount"] = (service_accounts or allowed_service_accounts())[0]
    for key, value in copy.deepcopy(dict(analytics or {})).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def validate(a: dict[str, Any], service_accounts: Sequence[str] | None = None) -> None:
    """The rules the schema cannot say; raises AnalyticsError (AnalyticsNotAllowed when
    the spec asks for rights or pods the operator does not hand out)."""
    allowed = tuple(service_accounts or allowed_service_accounts())
    if a["serviceAccount"] not in allowed:
        raise AnalyticsNotAllowed(
            f"analytics.serviceAccount {a['serviceAccount']!r} is not allowed: the operator"
            f" runs Spark drivers only as {', '.join(map(repr, allowed))}"
            f" (operator setting {SERVICE_ACCOUNTS_ENV}; see docs/spark.md)"
        )
    refused = refused_conf_keys(a["sparkConf"])
    if refused:
        raise AnalyticsNotAllowed(
            f"analytics.sparkConf may not set {', '.join(refused)}: the operator decides"
            " what Spark pods run as and mount (see docs/spark.md)"
        )
    if a["volumeAccess"] == "claim" and not a.get("claimName"):
        raise AnalyticsError("volumeAccess 'claim' needs analytics.claimName")
    if not a["output"].get("claimName") and not a["output"].get("uri"):
        raise AnalyticsError("analytics.output needs a claimName or a uri for the Parquet files")
    names = [j["name"] for j in a["jobs"]]
    if len(set(names)) != len(names):
        raise AnalyticsError("analytics.jobs names must be distinct")
    for job in a["jobs"]:
        if job["type"] not in JOB_FILES:
            raise AnalyticsError(f"unknown job type {job['type']!r}")
        if job["type"] == "extract" and not job.get("fields"):
            raise AnalyticsError(f"extract job {job['name']!r} needs fields")


def short_name(*parts: str, limit: int = NAME_LIMIT) -> str:
    """A DNS-1123 label from ``parts``, shortened with a hash to stay unique."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def labels(name: str, replica: int, job: str) -> dict[str, str]:
    """The Spark pods' labels (and their applications': the Spark Operator copies those on).

    Not the server's selector (``app.kubernetes.io/name: durable-streams`` with the
    instance): a Spark pod selected by it would count against the server's
    PodDisruptionBudget and block drains, receive the Services' client traffic, and
    be a candidate for adoption by the StatefulSet. ``instance`` and ``component``
    stay: the operator finds its ScheduledSparkApplications by them.
    """
    return {
        "app.kubernetes.io/name": ANALYTICS_APP,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "analytics",
        "app.kubernetes.io/part-of": "durable-streams",
        "app.kubernetes.io/managed-by": "durable-streams-operator",
        "streams.pyds.dev/replica": str(replica),
        "streams.pyds.dev/job": job,
    }


def pod_security_context() -> dict[str, Any]:
    """Pod level: what the PodSecurity ``restricted`` profile asks (non-root, seccomp);
    the image's UID unless the platform assigns one (the operator's setting
    ``DS_OPERATOR_SERVER_FIXED_UID``, false on OpenShift: pod_template.py)."""
    fixed = operator_settings.current().server_fixed_uid
    uid = {"runAsUser": SPARK_UID, "runAsGroup": SPARK_UID, "fsGroup": SPARK_UID}
    return {
        "runAsNonRoot": True,
        **(uid if fixed else {}),
        "fsGroupChangePolicy": "OnRootMismatch",  # no walk of every file at each start
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """Container level: no privilege escalation, no capabilities (``restricted``)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def server_pod(name: str, replica: int) -> str:
    return f"{name}-{replica}"


def data_claim(name: str, replica: int, a: dict[str, Any]) -> str:
    """The claim the job reads: the replica's own, or the one ``claimName`` names."""
    if a["volumeAccess"] == "claim":
        return str(a["claimName"]).replace("{replica}", str(replica))
    return f"data-{name}-{replica}"  # volumeClaimTemplate "data" of StatefulSet <name>


def affinity(name: str, replica: int) -> dict[str, Any]:
    """Run on the node of server pod ``<name>-<replica>``, where its RWO volume is attached."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/name": "durable-streams",
                            "app.kubernetes.io/instance": name,
                            "statefulset.kubernetes.io/pod-name": server_pod(name, replica),
                        }
                    },
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


def output_dir(name: str, replica: int, job: dict[str, Any], a: dict[str, Any]) -> str:
    base = a["output"].get("uri") or OUTPUT_MOUNT
    return f"{base.rstrip('/')}/{server_pod(name, replica)}/{job['name']}"


def job_arguments(name: str, replica: int, job: dict[str, Any], a: dict[str, Any]) -> list[str]:
    args = [DATA_MOUNT, "--out", output_dir(name, replica, job, a)]
    if job.get("streams"):
        args += ["--streams", job["streams"]]
    for spec in job.get("fields", []):
        args += ["--field", spec]
    return args + list(job.get("args", []))


def _volumes(
    name: str, replica: int, a: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {
            "name": "data",
            "persistentVolumeClaim": {"claimName": data_claim(name, replica, a), "readOnly": True},
        }
    ]
    mounts: list[dict[str, Any]] = [{"name": "data", "mountPath": DATA_MOUNT, "readOnly": True}]
    if a["output"].get("claimName") and not a["output"].get("uri"):
        volumes.append(
            {"name": "output", "persistentVolumeClaim": {"claimName": a["output"]["claimName"]}}
        )
        mounts.append({"name": "output", "mountPath": OUTPUT_MOUNT})
    return volumes, mounts


def application_spec(
    name: str, replica: int, job: dict[str, Any], a: dict[str, Any]
) -> dict[str, Any]:
    """A SparkApplicationSpec (the ``spec`` of a SparkApplication, the ``template`` of a
    ScheduledSparkApplication) for one job over one replica's data."""
    volumes, mounts = _volumes(name, replica, a)
    pod_labels = labels(name, replica, job["name"])
    roles: dict[str, dict[str, Any]] = {}
    for role in ("driver", "executor"):
        # Separate copies per role: callers (and YAML dumpers) may treat them as distinct.
        # The Spark Operator's webhook puts podSecurityContext on the pod and
        # securityContext on the Spark container.
        r: dict[str, Any] = copy.deepcopy(
            {
                **a[role],
                "labels": pod_labels,
                "volumeMounts": mounts,
                "podSecurityContext": pod_security_context(),
                "securityContext": container_security_context(),
            }
        )
        if role == "driver":
            r["serviceAccount"] = a["serviceAccount"]
        if a["volumeAccess"] == "coschedule":
            r["affinity"] = affinity(name, replica)
        roles[role] = r
    return {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": a["image"],
        "imagePullPolicy": a["imagePullPolicy"],
        "mainApplicationFile": JOB_FILES[job["type"]],
        "arguments": job_arguments(name, replica, job, a),
        "sparkVersion": a["sparkVersion"],
        "sparkConf": {"spark.sql.session.timeZone": "UTC", **a["sparkConf"]},
        "restartPolicy": {"type": "Never"},
        "volumes": volumes,
        "driver": roles["driver"],
        "executor": roles["executor"],
    }


def _metadata(
    name: str, namespace: str, uid: str, obj_name: str, replica: int, job: str
) -> dict[str, Any]:
    return {
        "name": obj_name,
        "namespace": namespace,
        "labels": labels(name, replica, job),
        "ownerReferences": [
            {
                "apiVersion": DS_API_VERSION,
                "kind": DS_KIND,
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def render_scheduled_applications(
    name: str,
    namespace: str,
    uid: str,
    spec: SpecInput,
    *,
    service_accounts: Sequence[str] | None = None,
    replicas: Sequence[int] | None = None,
    hold: bool = False,
) -> list[dict[str, Any]]:
    """Every ScheduledSparkApplication a DurableStream's ``spec.analytics`` asks for.

    Empty when analytics is not enabled. Raises AnalyticsError for a spec it
    cannot carry out or may not ask for (the operator reports it in a condition).
    ``service_accounts``: the allowed ones, by default the operator's setting.
    ``replicas``: the ordinals whose volumes are read, by default every one (each
    server its own data); for a replica set the operator names one in-sync standby
    (analytics_source.py), and ``hold`` suspends the jobs while none is in sync.
    """
    parsed = parse_spec(spec)
    a = with_defaults(dict(parsed.analytics), service_accounts)
    if not a["enabled"]:
        return []
    validate(a, service_accounts)
    out = []
    for replica in range(parsed.replicas) if replicas is None else replicas:
        for job in a["jobs"]:
            obj_spec: dict[str, Any] = {
                "schedule": a["schedule"],
                "concurrencyPolicy": a["concurrencyPolicy"],
                "suspend": bool(a["suspend"]) or hold,
                "successfulRunHistoryLimit": 3,
                "failedRunHistoryLimit": 3,
                "template": application_spec(name, replica, job, a),
            }
            if a.get("timeZone"):
                obj_spec["timeZone"] = a["timeZone"]
            out.append(
                {
                    "apiVersion": f"{SPARK_GROUP}/{SPARK_VERSION_API}",
                    "kind": "ScheduledSparkApplication",
                    "metadata": _metadata(
                        name,
                        namespace,
                        uid,
                        short_name(name, str(replica), job["name"]),
                        replica,
                        job["name"],
                    ),
                    "spec": obj_spec,
                }
            )
    return out


def render_application(
    name: str,
    namespace: str,
    uid: str,
    spec: SpecInput,
    *,
    replica: int,
    job: str,
    run: str,
    service_accounts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One run of job ``job`` over replica ``replica`` now, named after ``run``."""
    a = with_defaults(dict(parse_spec(spec).analytics), service_accounts)
    validate(a, service_accounts)
    jobs = {j["name"]: j for j in a["jobs"]}
    if job not in jobs:
        raise AnalyticsError(f"no analytics job named {job!r}")
    return {
        "apiVersion": f"{SPARK_GROUP}/{SPARK_VERSION_API}",
        "kind": "SparkApplication",
        "metadata": _metadata(
            name, namespace, uid, short_name(name, str(replica), job, run), replica, job
        ),
        "spec": application_spec(name, replica, jobs[job], a),
    }


def render_pod_template(name: str, replica: int, spec: SpecInput, job: str) -> dict[str, Any]:
    """A pod template file for spark-submit (driver and executor alike).

    spark-submit cannot express affinity through ``--conf``; a template can.
    Volumes are given with ``--conf`` (see ``spark_submit_argv``), which Spark
    adds to the template's pods.
    """
    a = with_defaults(dict(parse_spec(spec).analytics))
    pod_spec: dict[str, Any] = {
        "securityContext": pod_security_context(),
        # Spark builds its container on the template's first one, keeping its securityContext.
        "containers": [{"name": "spark", "securityContext": container_security_context()}],
    }
    if a["volumeAccess"] == "coschedule":
        pod_spec["affinity"] = affinity(name, replica)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": labels(name, replica, job)},
        "spec": pod_spec,
    }


def spark_submit_argv(
    name: str,
    namespace: str,
    spec: SpecInput,
    *,
    replica: int,
    job: str,
    api_server: str,
    pod_template: str,
    service_accounts: Sequence[str] | None = None,
) -> list[str]:
    """The ``spark-submit --master k8s://...`` equivalent of one SparkApplication run."""
    a = with_defaults(dict(parse_spec(spec).analytics), service_accounts)
    validate(a, service_accounts)
    jobs = {j["name"]: j for j in a["jobs"]}
    if job not in jobs:
        raise AnalyticsError(f"no analytics job named {job!r}")
    conf: dict[str, str] = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": a["image"],
        "spark.kubernetes.container.image.pullPolicy": a["imagePullPolicy"],
        "spark.kubernetes.authenticate.driver.serviceAccountName": a["serviceAccount"],
        "spark.kubernetes.driver.podTemplateFile": pod_template,
        "spark.kubernetes.executor.podTemplateFile": pod_template,
        "spark.driver.cores": str(a["driver"]["cores"]),
        "spark.driver.memory": a["driver"]["memory"],
        "spark.executor.instances": str(a["executor"]["instances"]),
        "spark.executor.cores": str(a["executor"]["cores"]),
        "spark.executor.memory": a["executor"]["memory"],
        "spark.sql.session.timeZone": "UTC",
    }
    volumes, mounts = _volumes(name, replica, a)
    for vol, mount in zip(volumes, mounts, strict=True):
        for role in ("driver", "executor"):
            prefix = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim.{vol['name']}"
            conf[f"{prefix}.options.claimName"] = vol["persistentVolumeClaim"]["claimName"]
            conf[f"{prefix}.mount.path"] = mount["mountPath"]
            conf[f"{prefix}.mount.readOnly"] = "true" if mount.get("readOnly") else "false"
    conf.update(a["sparkConf"])
    argv = [
        "spark-submit",
        "--master",
        f"k8s://{api_server}",
        "--deploy-mode",
        "cluster",
        "--name",
        short_name(name, str(replica), job),
    ]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, JOB_FILES[jobs[job]["type"]], *job_arguments(name, replica, jobs[job], a)]
