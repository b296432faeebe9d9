"""What a DurableStream becomes: the desired Kubernetes objects, as plain dicts.

Pure functions of (name, namespace, uid, spec): no API calls, so every
object the operator would apply is unit-tested without a cluster.

Kept whole although long: the objects of one DurableStream side by side, so that the
names, labels and selectors that must agree between them are read in one place.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from stream_operator import GROUP, KIND, VERSION
from stream_operator.api import pod_template
from stream_operator.api.server_settings import settings_env
from stream_operator.api.spec import (
    MAX_REPLICAS,
    DurableStreamSpec,
    LifecycleSpec,
    RetentionRule,
    SpecInput,
    hashed,
    with_defaults,
)
from stream_operator.configuration import operator_settings
from stream_operator.specs import archive_render, disruptions, network_policy, webhook_ca
from stream_operator.specs.certificates import (
    certificate_name,
    render_certificate,
    with_certificate,
)
from stream_operator.specs.monitoring import podmonitor_settings, render_podmonitor

DATA_DIR = "/data"
CONTAINER_PORT = 4437
SERVER_CONTAINER = "server"
CONFIG_HASH = f"{GROUP}/config-hash"
STORAGE_SIZE = f"{GROUP}/storage-size"
MANAGED_BY = "durable-streams-operator"
COMPONENT = "app.kubernetes.io/component"
# A replica set's pods carry their role, which the operator sets from the Lease holder
# (replica_set.label_roles): the client Service selects the primary, ``-replicas`` the rest.
ROLE = f"{GROUP}/role"
PRIMARY = "primary"
STANDBY = "standby"
# A replica set's pods are Ready only while in sync: a readiness gate whose condition the
# Lease holder sets on each pod (stream_server.replication.lease.pod_labels; the operator too,
# replica_set.mark_in_sync), so the -replicas Service and the disruption budget count
# only the pods that hold every acknowledged write.
IN_SYNC = f"{GROUP}/in-sync"


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "durable-streams",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "durable-streams", "app.kubernetes.io/instance": name}


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(name: str, namespace: str, uid: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(extra.pop("instance", name)),
        "ownerReferences": [owner_reference(extra.pop("owner", name), uid)],
        **extra,
    }


def headless_name(name: str) -> str:
    return f"{name}-headless"


def replicas_name(name: str) -> str:
    """The standbys' Service (CloudNativePG's ``-ro``)."""
    return f"{name}-replicas"


def lease_name(name: str) -> str:
    """The Lease that elects the replica set's primary, in the DurableStream's namespace."""
    return f"{name}-leader"


def service_account_name(name: str) -> str:
    return name


def replication_secret_name(name: str) -> str:
    """The replica set's peer token (key ``token``): made once by the operator, never
    rendered from the spec (reconcile._ensure_replication_secret)."""
    return f"{name}-replication"


REPLICATION_TOKEN_DIR = "/etc/durable-streams/replication"
TLS_DIR = "/etc/durable-streams/tls"  # where server.tlsSecretName is mounted
# The pod's annotations (downward API): the server is fenced while they hold
# streams.pyds.dev/fenced="true" (stream_server/fencing.py; lifecycle.py writes it).
# Beside them, the pod's name and the operator's list of fenced pods (its ConfigMap
# <name>-fence, written before the annotations), which fence a pod made after the fence
# from its start, before the operator has annotated it. The ConfigMap is optional (an
# unfenced object may have none) and not in the config hash: fencing rolls no pod.
PODINFO_DIR = "/etc/durable-streams/podinfo"
FENCE_ENV = {"name": "DS_FENCE_FILE", "value": f"{PODINFO_DIR}/annotations"}
FENCE_LIST_KEY = "fenced-instances"  # stream_server.fencing.LIST_FILE
POD_NAME_FILE = "pod-name"  # stream_server.fencing.NAME_FILE


def fence_configmap_name(name: str) -> str:
    return f"{name}-fence"


def podinfo_volume(name: str) -> dict[str, Any]:
    downward = [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        {"path": POD_NAME_FILE, "fieldRef": {"fieldPath": "metadata.name"}},
    ]
    listed = {
        "name": fence_configmap_name(name),
        "optional": True,
        "items": [{"key": FENCE_LIST_KEY, "path": FENCE_LIST_KEY}],
    }
    sources = [{"downwardAPI": {"items": downward}}, {"configMap": listed}]
    return {"name": "podinfo", "projected": {"sources": sources}}


def render_fence_configmap(
    name: str, namespace: str, uid: str, fenced: list[str]
) -> dict[str, Any]:
    """The operator's list of fenced pods (``lifecycle_actions.fence_pods`` writes it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(fence_configmap_name(name), namespace, uid, instance=name, owner=name),
        "data": {FENCE_LIST_KEY: json.dumps(sorted(fenced))},
    }


def _scheme(spec: DurableStreamSpec) -> str:
    return "https" if spec.server.tls_secret_name else "http"


def pod_url(name: str, namespace: str, pod: str, spec: SpecInput) -> str:
    """Where a replica set's pod answers, through the headless Service (its peers' URL)."""
    scheme = _scheme(with_certificate(name, spec))
    return f"{scheme}://{pod}.{headless_name(name)}.{namespace}.svc:{CONTAINER_PORT}"


def replication_env(name: str, namespace: str, spec: SpecInput) -> dict[str, str]:
    """A replica set's settings that are the same on every pod (none with one replica:
    single-node mode, exactly as before). Each pod's own name and URL come from the
    downward API (``replica_identity_env``)."""
    s = with_defaults(spec)
    if not s.replicated:
        return {}
    rep = s.replication
    env = {
        "DS_REPLICATION_LEASE": f"{namespace}/{lease_name(name)}",
        "DS_REPLICATION_SET_SIZE": str(s.replicas),
        "DS_MIN_IN_SYNC": str(s.min_in_sync),
        "DS_REPLICATION_DURABILITY": rep.durability,
        "DS_LEASE_DURATION": str(rep.lease_duration_seconds),
        "DS_LEASE_RENEW_DEADLINE": str(rep.renew_deadline_seconds),
        "DS_LEASE_RETRY_PERIOD": str(rep.retry_period_seconds),
        # Peers (the stream, snapshot) and the operator (switchover) show this Bearer token.
        "DS_REPLICATION_TOKEN_FILE": f"{REPLICATION_TOKEN_DIR}/token",
        # Only pod 0 starts a new set from empty storage; a pod holding data always may,
        # so a single server scaled up keeps its data (pod 0 leads, the others copy).
        "DS_REPLICATION_BOOTSTRAP": f"{name}-0",
    }
    if rep.read_staleness_seconds is not None:
        # Only when set: the server's own default otherwise, and no roll for sets that
        # never asked for it.
        env["DS_REPLICATION_READ_STALENESS"] = str(rep.read_staleness_seconds)
    if s.server.tls_secret_name:
        # The peers' certificates are the TLS Secret's: check them against its issuer's
        # CA, which cert-manager writes next to them (a private CA the system lacks).
        env["DS_REPLICATION_CA_FILE"] = f"{TLS_DIR}/ca.crt"
    return env


def replica_identity_env(name: str, namespace: str, spec: SpecInput) -> list[dict[str, Any]]:
    """The pod's name (downward API), its identity in the Lease and the URL peers reach it
    at through the headless Service; ``$(POD_NAME)`` is expanded by the kubelet because
    POD_NAME comes first in the list."""
    s = with_defaults(spec)
    if not s.replicated:
        return []
    scheme = _scheme(s)
    host = f"$(POD_NAME).{headless_name(name)}.{namespace}.svc"
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "DS_REPLICA_NAME", "value": "$(POD_NAME)"},
        # The pod the server labels with its role (and, as primary, the others).
        {"name": "DS_REPLICATION_POD", "value": "$(POD_NAME)"},
        {"name": "DS_REPLICA_URL", "value": f"{scheme}://{host}:{CONTAINER_PORT}"},
    ]


def endpoint(name: str, namespace: str, spec: SpecInput) -> str:
    s = with_certificate(name, spec)
    return f"{_scheme(s)}://{name}.{namespace}.svc:{s.service.port}/v1/stream/"


AUTH_DIR = "/etc/durable-streams/auth"  # where server.authTokensSecret is mounted


def server_env(spec: SpecInput) -> dict[str, str]:
    """The server's settings, as the DS_* variables it reads (see stream_server.config)."""
    srv = with_defaults(spec).server
    env = {
        "DS_HOST": "::",  # both families (listen.py; 0.0.0.0 where the node has no IPv6)
        "DS_PORT": str(CONTAINER_PORT),
        "DS_DATA_DIR": DATA_DIR,
        "DS_LONG_POLL_TIMEOUT": str(srv.long_poll_timeout_seconds),
        "DS_SSE_RECONNECT_INTERVAL": str(srv.sse_reconnect_interval_seconds),
        "DS_MAX_BODY_BYTES": str(srv.max_body_bytes),
        "DS_DEFAULT_TTL": str(srv.default_ttl_seconds),
        "DS_LOG_LEVEL": srv.log_level,
        "DS_LOG_FORMAT": srv.log_format,
    }
    if srv.auth_tokens is not None:
        env["DS_AUTH_TOKENS_FILE"] = f"{AUTH_DIR}/{srv.auth_tokens.key}"
    if srv.tls_secret_name:
        env["DS_TLS_CERT"] = f"{TLS_DIR}/tls.crt"
        env["DS_TLS_KEY"] = f"{TLS_DIR}/tls.key"
    if srv.rate_limit is not None:
        env["DS_RATE_LIMIT"] = str(srv.rate_limit.requests_per_second)
        env["DS_RATE_BURST"] = str(srv.rate_limit.burst)
    if srv.webhook_allow:
        env["DS_WEBHOOK_ALLOW"] = ",".join(srv.webhook_allow)
    if srv.public_url:
        env["DS_PUBLIC_URL"] = srv.public_url
    if srv.retention:
        env["DS_RETENTION"] = ";".join(retention_policy(r) for r in srv.retention)
    if srv.workers is not None or not cpu_limited(spec):
        env["DS_WORKERS"] = str(1 if srv.workers is None else srv.workers)
    # Every other setting, by its flag name (refused_change has checked the names).
    env |= settings_env(srv.settings) | webhook_ca.env(srv)
    return env


def cpu_limited(spec: SpecInput) -> bool:
    """Whether the server container has a CPU limit (``spec.resources.limits.cpu``)."""
    limits = with_defaults(spec).resources.get("limits") or {}
    return limits.get("cpu") not in (None, "")


def workers_env(spec: SpecInput) -> list[dict[str, Any]]:
    """DS_WORKERS from the container's CPU limit, where ``server.workers`` is left out and
    there is a limit: the downward API rounds the limit up to whole CPUs (2500m: 3), and it
    follows the limit when the resources change (which rolls the pods already). Without a
    limit the downward API would give the node's allocatable CPUs, which a pod may share
    with many others: ``server_env`` sets one process then, and a set number goes there
    too (the config hash covers it). docs/kubernetes.md, "Sizing a pod"."""
    s = with_defaults(spec)
    if s.server.workers is not None or not cpu_limited(s):
        return []
    field = {"containerName": SERVER_CONTAINER, "resource": "limits.cpu", "divisor": "1"}
    return [{"name": "DS_WORKERS", "valueFrom": {"resourceFieldRef": field}}]


# Kubernetes' binary suffixes, which the CRD also takes, as the server writes them.
_SERVER_SIZE_UNITS = {"Ki": "KiB", "Mi": "MiB", "Gi": "GiB", "Ti": "TiB"}


def retention_policy(rule: RetentionRule) -> str:
    """One ``spec.server.retention`` entry as the server's ``PREFIX:RULES``
    (``logs/:max-bytes=10GiB,max-age=7d``; docs/retention.md)."""
    rules = []
    if rule.max_bytes:
        digits = rule.max_bytes.rstrip("BKMGTi")  # the CRD's pattern: digits, then a unit
        unit = rule.max_bytes[len(digits) :]
        rules.append(f"max-bytes={digits}{_SERVER_SIZE_UNITS.get(unit, unit)}")
    if rule.max_age:
        rules.append(f"max-age={rule.max_age}")
    return f"{rule.prefix}:{','.join(rules)}"


def config_hash(spec: SpecInput) -> str:
    """Changes whenever the pods must restart: server settings, image, resources, mounts;
    for a replica set also its replication settings and in-sync count (a scale that moves
    the majority restarts the pods; one that does not leaves the set size the running pods
    report one behind, which they only report). One replica hashes as it always did; a
    default the CRD gained later, holding its default, is left out (``spec.hashed``)."""
    s = with_defaults(spec)
    raw = hashed(s)
    relevant = {
        k: raw[k] for k in ("image", "imagePullPolicy", "server", "resources", "scheduling")
    }
    if s.replicated:
        relevant |= {"replication": raw["replication"], "minInSync": s.min_in_sync}
    relevant |= archive_render.config_fields(s)  # nothing without an archive
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def render_configmap(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    s = with_defaults(spec)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(f"{name}-config", namespace, uid, instance=name, owner=name),
        "data": {
            **server_env(s),
            **replication_env(name, namespace, s),
            **archive_render.archive_env(s),
        },
    }


STARTUP_PERIOD = 2  # seconds between startup probes: a recovered server is seen soon


def _probes(life: LifecycleSpec, scheme: str) -> dict[str, Any]:
    """The three probes from ``spec.lifecycle``.

    The startup probe holds liveness off for ``startupTimeoutSeconds`` (recovery of
    a large directory replays the WAL and checks every stream's tail); a probe's
    timeout never exceeds its period.
    """
    startup_failures = -(-life.startup_timeout_seconds // STARTUP_PERIOD)  # ceiling
    return {
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http", "scheme": scheme},
            "periodSeconds": life.readiness_period_seconds,
            "timeoutSeconds": min(3, life.readiness_period_seconds),
            "failureThreshold": life.readiness_failure_threshold,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http", "scheme": scheme},
            "periodSeconds": life.liveness_period_seconds,
            "timeoutSeconds": min(5, life.liveness_period_seconds),
            "failureThreshold": life.liveness_failure_threshold,
        },
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "http", "scheme": scheme},
            "periodSeconds": STARTUP_PERIOD,
            "failureThreshold": max(1, startup_failures),
        },
    }


def render_statefulset(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    s = with_defaults(spec)
    srv = s.server
    scheme = _scheme(s).upper()
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}, podinfo_volume(name)]
    mounts = [
        {"name": "data", "mountPath": DATA_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
    ]
    if srv.auth_tokens is not None:
        volumes.append({"name": "auth", "secret": {"secretName": srv.auth_tokens.name}})
        mounts.append({"name": "auth", "mountPath": AUTH_DIR, "readOnly": True})
    if srv.tls_secret_name:
        volumes.append({"name": "tls", "secret": {"secretName": srv.tls_secret_name}})
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    if s.replicated:
        secret = {"secretName": replication_secret_name(name), "defaultMode": 0o440}
        volumes.append({"name": "replication", "secret": secret})
        mounts.append({"name": "replication", "mountPath": REPLICATION_TOKEN_DIR, "readOnly": True})
    archive_volumes, archive_mounts = archive_render.server_volumes(s)
    ca_volumes, ca_mounts = webhook_ca.mount(srv)
    archive_volumes, archive_mounts = archive_volumes + ca_volumes, archive_mounts + ca_mounts
    volumes += archive_volumes
    mounts += archive_mounts
    container = {
        "name": SERVER_CONTAINER,
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "args": ["serve"],
        "envFrom": [{"configMapRef": {"name": f"{name}-config"}}],
        "env": [
            *replica_identity_env(name, namespace, s),
            FENCE_ENV,
            *workers_env(s),
            *archive_render.credential_env(archive_render.served_store(s)),
        ],
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        **_probes(s.lifecycle, scheme),
        # A container that exits without writing /dev/termination-log (the server logs its
        # refusal: a newer data format, a bad setting) gets the end of its log as the
        # termination message, which the operator's status then shows.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": s.resources,
        "volumeMounts": mounts,
        "securityContext": pod_template.container_security_context(s.template),
    }
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": s.storage.size}},
    }
    if s.storage.storage_class_name:
        pvc_spec["storageClassName"] = s.storage.storage_class_name
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        # SIGTERM, then in-flight batches finish and a final checkpoint runs.
        "terminationGracePeriodSeconds": s.lifecycle.termination_grace_period_seconds,
        "securityContext": pod_template.pod_security_context(s.template),
        "enableServiceLinks": False,
    }
    if s.image_pull_secrets:
        pod_spec["imagePullSecrets"] = list(s.image_pull_secrets)
    restore, restore_volumes = archive_render.restore_init_container(name, s, container)
    if restore:
        pod_spec["initContainers"] = restore
        volumes += restore_volumes
    if s.replicated:
        # The pods' own rights: their Lease and their pods (render_role).
        pod_spec["serviceAccountName"] = service_account_name(name)
        pod_spec["readinessGates"] = [{"conditionType": IN_SYNC}]
    else:
        # A single server never calls the API, so its pod holds no token of the
        # namespace's default ServiceAccount: a token it does not need would only serve
        # whoever broke into the pod. Given template.serviceAccount (IRSA, workload
        # identity) it runs as its own account.
        pod_spec["automountServiceAccountToken"] = False
        if pod_template.wants_service_account(s.template):
            pod_spec["serviceAccountName"] = service_account_name(name)
    pod_spec |= pod_template.placement(s.scheduling, selector(name), s.replicated)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(name, namespace, uid, annotations={STORAGE_SIZE: s.storage.size}),
        "spec": {
            "replicas": s.replicas,
            "serviceName": headless_name(name),
            # Pods are independent servers with their own volumes: start them together.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(name)},
            # A replica set's pods are replaced by the operator, standbys first, the
            # primary after a switchover (rollout.py); one server rolls as usual.
            "updateStrategy": {"type": "OnDelete" if s.replicated else "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": s.storage.pvc_retention,
                "whenScaled": "Retain",
            },
            "template": {
                "metadata": {
                    "labels": pod_template.pod_labels(s.template, labels(name)),
                    "annotations": pod_template.pod_annotations(
                        s.template, {CONFIG_HASH: config_hash(s)}
                    ),
                },
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "labels": selector(name)},
                    "spec": pvc_spec,
                }
            ],
        },
    }


def render_headless_service(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(headless_name(name), namespace, uid, instance=name, owner=name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector(name),
            "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": "http"}],
        },
    }


def render_service(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    """The clients' Service: the one server, or a replica set's primary only (CloudNativePG's
    ``-rw``): writes go where they can be acknowledged."""
    s = with_defaults(spec)
    meta = _meta(name, namespace, uid)
    meta["labels"][COMPONENT] = "client"
    chosen = {**selector(name), ROLE: PRIMARY} if s.replicated else selector(name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": s.service.type,
            "selector": chosen,
            # Each pod holds its own streams: keep a client on the pod it started with.
            "sessionAffinity": "ClientIP",
            "ports": [{"name": "http", "port": s.service.port, "targetPort": "http"}],
        },
    }


def render_replicas_service(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    """The standbys (CloudNativePG's ``-ro``): reads that may lag the primary."""
    s = with_defaults(spec)
    meta = _meta(replicas_name(name), namespace, uid, instance=name, owner=name)
    meta["labels"][COMPONENT] = "replicas"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": {**selector(name), ROLE: STANDBY},
            "ports": [{"name": "http", "port": s.service.port, "targetPort": "http"}],
        },
    }


def render_service_account(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    meta = _meta(service_account_name(name), namespace, uid, instance=name, owner=name)
    given = pod_template.service_account_metadata(with_defaults(spec).template)
    meta["labels"] = {**given.get("labels", {}), **meta["labels"]}
    if "annotations" in given:
        meta["annotations"] = given["annotations"]  # IRSA's role-arn, GKE's gcp-service-account
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta,
        # The token is mounted: the servers read and write their Lease with it.
        "automountServiceAccountToken": True,
    }


def pod_names(name: str) -> list[str]:
    """Every pod a replica set can have (``<name>-0`` .. ``<name>-4``): the pods' Role names
    them all, so a scale needs no new Role."""
    return [f"{name}-{i}" for i in range(MAX_REPLICAS)]


def render_role(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    """Exactly what the servers ask of the API: their own Lease, by name (a watch names
    it by ``fieldSelector=metadata.name``, which resourceNames authorizes), and their own
    set's pods by name: read one, patch its role label, patch its status (the in-sync
    condition). ``create`` cannot be limited by resourceNames in Kubernetes (the name is
    not known when a create is authorized), so it is granted on leases in this namespace
    (docs/kubernetes.md)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, namespace, uid),
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [lease_name(name)],
                "verbs": ["get", "update", "watch"],
            },
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "resourceNames": pod_names(name),
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": [""],
                "resources": ["pods/status"],
                "resourceNames": pod_names(name),
                "verbs": ["patch"],
            },
        ],
    }


def render_role_binding(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, namespace, uid),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": service_account_name(name), "namespace": namespace}
        ],
    }


def render_replication_secret(name: str, namespace: str, uid: str, token: str) -> dict[str, Any]:
    """The peer token's Secret, owned by the DurableStream (it goes with it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(replication_secret_name(name), namespace, uid, instance=name, owner=name),
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }


def render_pdb(name: str, namespace: str, uid: str, spec: SpecInput) -> dict[str, Any]:
    """One pod at a time whenever the set stays writable with one pod away, counting Ready
    (in sync) pods, the primary among them; none where every write needs every pod; pods
    that are not Ready may always go (stream_operator.specs.disruptions says why)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(name, namespace, uid),
        "spec": {**disruptions.budget(spec), "selector": {"matchLabels": selector(name)}},
    }


def desired_objects(
    name: str,
    namespace: str,
    uid: str,
    spec: SpecInput,
    *,
    podmonitor_crd: bool = False,
    certificate_crd: bool = False,
    monitor_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every object a DurableStream owns, in the order they should be applied.

    ``podmonitor_crd``/``certificate_crd``: whether the Prometheus Operator's PodMonitor
    and cert-manager's Certificate are served.
    """
    s = with_certificate(name, spec)
    objs = [render_configmap(name, namespace, uid, s)]
    if certificate_crd and (
        cert := render_certificate(
            name,
            namespace,
            _meta(certificate_name(name), namespace, uid, instance=name, owner=name),
            s,
        )
    ):
        # Before the pods that mount its Secret.
        objs.append(cert)
    if s.replicated or pod_template.wants_service_account(s.template):
        # Before the StatefulSet: its pods start with their account.
        objs.append(render_service_account(name, namespace, uid, s))
    if s.replicated:
        # Before the StatefulSet: its pods can see their peers.
        objs += [
            render_role(name, namespace, uid, s),
            render_role_binding(name, namespace, uid, s),
        ]
    objs += [
        render_headless_service(name, namespace, uid, s),
        render_service(name, namespace, uid, s),
    ]
    if s.replicated:
        objs.append(render_replicas_service(name, namespace, uid, s))
    objs += [
        render_pdb(name, namespace, uid, s),
        render_statefulset(name, namespace, uid, s),
    ]
    if podmonitor_crd and podmonitor_settings(s).enabled:
        meta = _meta(name, namespace, uid)
        objs.append(render_podmonitor(name, namespace, meta, s, selector(name), monitor_labels))
    policy = network_policy.render_network_policy(
        name,
        namespace,
        _meta(name, namespace, uid),
        s,
        selector(name),
        CONTAINER_PORT,
        operator_settings.current().namespace or None,
    )
    if policy is not None:
        objs.append(policy)
    return objs
