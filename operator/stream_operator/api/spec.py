"""The DurableStream spec, parsed once into typed frozen views, and the changes the
operator refuses. Kept whole although long: the views, their defaults and the
refusals name the same fields, and one file keeps them in step.

``with_defaults`` fills every default in (``DEFAULTS``, and the defaults inside
optional objects below it) and parses the result into ``DurableStreamSpec``, as kopf's
``bodies`` module gives typed views over Kubernetes bodies: the reconcile parses the
object's spec once and hands the typed spec to rendering, status, rollout and scaling,
which read attributes, never ``.get`` with a default of their own. A parsed spec passed
to ``with_defaults`` again is returned as it is.

The defaults live in the CRD schema (``default:``): the API server sets them in every
object it stores and in every object it returns, one stored under an older CRD
included, so ``kubectl get -o yaml`` shows what applies. ``with_defaults`` applies the
same ones (the schema's and this module's are checked equal by
tests/operator/test_crd_schema.py) for specs the schema did not default: read from an
annotation, written under an older CRD, given by tests and the kubectl plugin. The
schema's ranges and CEL rules validate before the operator sees anything; the
``refused_*`` functions are the operator's own check, for clusters and paths where the
schema did not run. tests/operator/test_settings_defaults.py checks the defaults for
every setting rendered into the server's environment against the server's own.

A default added to the CRD later goes in ``LATER_DEFAULTS``, never in ``DEFAULTS``:
the config hash (``hashed``) leaves such a field out while it holds its default, so the
upgrade that adds it (the API server then returns it in every object) rolls no pod.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stream_operator import GROUP
from stream_operator.api import archive_spec, pod_template, quantities, server_settings
from stream_operator.api.archive_spec import BackupSpec, RecoverySpec, ReplicaSpec, SecretKey

# The server image for a spec that names none: the operator's own setting, which the
# chart sets from its version, so that upgrading the operator upgrades every server
# that did not pin an image (the CRD defaults no image into the objects for that reason).
SERVER_IMAGE_ENV = "DS_OPERATOR_SERVER_IMAGE"
# Pull secrets (comma-separated names) for servers whose spec names none.
SERVER_PULL_SECRETS_ENV = "DS_OPERATOR_SERVER_IMAGE_PULL_SECRETS"
DEFAULT_IMAGE = "durable-streams-server:0.1.0"  # an operator started without the setting
DEFAULTS: dict[str, Any] = {
    "imagePullPolicy": "IfNotPresent",
    "replicas": 1,
    # A replica set's primary is updated after a switchover the operator makes
    # (unsupervised) or one the user makes (supervised), as CloudNativePG's field.
    "primaryUpdateStrategy": "unsupervised",
    "storage": {"size": "10Gi", "pvcRetention": "Retain"},
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "server": {
        "longPollTimeoutSeconds": 30,
        "sseReconnectIntervalSeconds": 60,
        "maxBodyBytes": 64 * 1024 * 1024,
        "defaultTTLSeconds": 0,
        "logLevel": "info",
        "logFormat": "json",
        # No defaults for ``subscriptions`` (webhookAllow, publicURL) or ``retention``:
        # left out, the server's own (nothing allowed, the request's origin, keep
        # everything) hold. A default here would change every existing spec's config hash
        # and restart every server once for nothing.
    },
    "scheduling": {},
    # Read only with replicas > 1 (a replica set; docs/replication.md). minInSync 0: a
    # majority of the replicas, the server's own default. Timings as client-go's elector.
    "replication": {
        "minInSync": 0,
        "durability": "required",
        "leaseDurationSeconds": 15,
        "renewDeadlineSeconds": 10,
        "retryPeriodSeconds": 2,
    },
    "service": {"type": "ClusterIP", "port": 4437},
    # podMonitor's interval has no default here: left out, monitoring.DEFAULT_INTERVAL.
    "metrics": {"podMonitor": {"enabled": False}},
    # Probe timings and shutdown (CloudNativePG's startDelay/stopDelay): recovery of a
    # large data directory may need more than five minutes, a slow disk more than 30 s
    # to finish its last batch and checkpoint.
    "lifecycle": {
        "startupTimeoutSeconds": 300,
        "terminationGracePeriodSeconds": 30,
        "readinessPeriodSeconds": 5,
        "readinessFailureThreshold": 2,
        "livenessPeriodSeconds": 10,
        "livenessFailureThreshold": 6,
    },
}

# Defaults inside optional objects, applied where the object is given: the auth tokens'
# key, a rate limit's burst, and cert-manager's issuer kind and group.
AUTH_TOKENS_KEY = "tokens.json"
RATE_BURST = 100
ISSUER_KIND = "Issuer"
CERT_MANAGER_GROUP = "cert-manager.io"
# The same by path, set where the parent object exists, as the API server sets them: the
# CRD has had them from the start, so every stored object has them and the hash covers them.
NESTED_DEFAULTS: dict[tuple[str, ...], Any] = {
    ("server", "authTokensSecret", "key"): AUTH_TOKENS_KEY,
    ("server", "rateLimit", "burst"): RATE_BURST,
    ("certificates", "issuerRef", "kind"): ISSUER_KIND,
    ("certificates", "issuerRef", "group"): CERT_MANAGER_GROUP,
    ("analytics", "enabled"): False,
}
# Defaults the CRD gained after config hashes were first taken (none yet), by path, set
# where the parent exists. Each is left out of the hash while it holds its default
# (``hashed``): the CRD upgrade that adds one makes the API server return it in every
# stored object, and the hash must stay what the operator before it computed. A renderer
# must likewise render such a setting only when it differs from the default (which is
# the server's own: test_settings_defaults.py), or the pod template changes anyway.
LATER_DEFAULTS: dict[tuple[str, ...], Any] = {}


@dataclass(frozen=True)
class StorageSpec:
    """``spec.storage``: each pod's volume."""

    size: str
    pvc_retention: str  # Retain or Delete: whether the claims go with the DurableStream
    storage_class_name: str | None


@dataclass(frozen=True)
class RateLimitSpec:
    """``spec.server.rateLimit``: per-client requests per second and burst."""

    requests_per_second: float
    burst: int


@dataclass(frozen=True)
class RetentionRule:
    """One ``spec.server.retention`` entry: the streams under ``prefix`` are trimmed to
    ``max_bytes`` and/or ``max_age`` (docs/retention.md)."""

    prefix: str
    max_bytes: str | None
    max_age: str | None


@dataclass(frozen=True)
class ServerSpec:
    """``spec.server``: the settings rendered into the server's DS_* variables."""

    long_poll_timeout_seconds: int
    sse_reconnect_interval_seconds: int
    max_body_bytes: int
    default_ttl_seconds: int
    log_level: str
    log_format: str
    auth_tokens: SecretKey | None  # spec.server.authTokensSecret: the tokens file
    tls_secret_name: str | None
    rate_limit: RateLimitSpec | None
    webhook_allow: tuple[str, ...]  # spec.server.subscriptions.webhookAllow
    public_url: str | None  # spec.server.subscriptions.publicURL
    retention: tuple[RetentionRule, ...]
    # spec.server.workers: the server's processes (DS_WORKERS; 0: one per CPU it may use).
    # None: the pod's CPU limit decides (render.workers_env; docs/kubernetes.md).
    workers: int | None
    # spec.server.settings: any other server setting by its flag name (server_settings.py).
    settings: Mapping[str, Any]
    webhook_ca: SecretKey | None  # spec.server.subscriptions.webhookCA (webhook_ca.py)


@dataclass(frozen=True)
class ReplicationSpec:
    """``spec.replication``: read only with more than one replica (docs/replication.md)."""

    min_in_sync: int  # 0: a majority, as the server counts
    durability: str  # required or preferred
    lease_duration_seconds: int
    renew_deadline_seconds: int
    retry_period_seconds: int
    read_staleness_seconds: float | None  # None: the server's own default


@dataclass(frozen=True)
class ServiceSpec:
    """``spec.service``: the clients' Service."""

    type: str
    port: int


@dataclass(frozen=True)
class MonitorSpec:
    """``spec.metrics.podMonitor``."""

    enabled: bool
    interval: str | None
    labels: Mapping[str, str]
    tls_config: Mapping[str, Any]  # the Prometheus Operator's SafeTLSConfig, as given


@dataclass(frozen=True)
class MetricsSpec:
    """``spec.metrics``."""

    pod_monitor: MonitorSpec


@dataclass(frozen=True)
class LifecycleSpec:
    """``spec.lifecycle``: probe timings and the shutdown grace period."""

    startup_timeout_seconds: int
    termination_grace_period_seconds: int
    readiness_period_seconds: int
    readiness_failure_threshold: int
    liveness_period_seconds: int
    liveness_failure_threshold: int


@dataclass(frozen=True)
class IssuerRef:
    """``spec.certificates.issuerRef`` with cert-manager's defaults."""

    name: str
    kind: str
    group: str


@dataclass(frozen=True)
class CertificatesSpec:
    """``spec.certificates``: the server's certificate made by cert-manager."""

    issuer_ref: IssuerRef | None  # None: no issuer named, no Certificate
    secret_name: str | None
    duration: str | None
    renew_before: str | None
    # Neither issuer nor server.tlsSecretName: a replica set's servers serve a certificate
    # from the operator's own CA (builtin_ca.py) unless this is false.
    built_in: bool = True


@dataclass(frozen=True)
class DurableStreamSpec:
    """A DurableStream's spec, parsed once with every default applied (``with_defaults``).

    ``raw`` is the same spec as a defaulted dict: the config hash is taken over it (so a
    hash is what it always was, and the pods do not roll on an operator upgrade), and the
    parts that are Kubernetes structures passed through as given (``resources``,
    ``scheduling``, ``template``, ``imagePullSecrets``, ``analytics``) are views into it.
    Nothing may change it: a changed spec is made with ``changed``.
    """

    raw: Mapping[str, Any]
    image: str
    image_pull_policy: str
    image_pull_secrets: tuple[Mapping[str, Any], ...]
    replicas: int
    primary_update_strategy: str
    storage: StorageSpec
    resources: Mapping[str, Any]
    server: ServerSpec
    scheduling: Mapping[str, Any]
    template: Mapping[str, Any]  # spec.template: pod and ServiceAccount (pod_template.py)
    replication: ReplicationSpec
    service: ServiceSpec
    metrics: MetricsSpec
    lifecycle: LifecycleSpec
    certificates: CertificatesSpec
    analytics: Mapping[str, Any]  # analytics.with_defaults parses it (its own defaults)
    backup: BackupSpec | None  # spec.backup: this set's archive (archive_spec.py)
    recovery: RecoverySpec | None  # spec.bootstrap.recovery
    replica: ReplicaSpec  # spec.replica: follow another set's archive

    @property
    def replicated(self) -> bool:
        """Whether the spec asks for a replica set (one primary, standbys, a Lease) rather
        than one server in single-node mode."""
        return self.replicas > 1

    @property
    def min_in_sync(self) -> int:
        """Replicas, the primary included, that must hold a batch before it is
        acknowledged: ``replication.minInSync``, or a majority when it is 0 (as the server
        counts)."""
        return self.replication.min_in_sync or self.replicas // 2 + 1

    def changed(self, **fields: Any) -> DurableStreamSpec:
        """This spec with top-level fields replaced (raw CRD names: ``image``,
        ``replicas``, ``server``), parsed again."""
        return with_defaults({**self.raw, **fields})


# Where a spec is asked for, a parsed one or the object's spec as the API returns it
# (parsed then, once): tests and the kubectl plugin hand in raw specs.
SpecInput = DurableStreamSpec | Mapping[str, Any] | None


def with_defaults(spec: SpecInput) -> DurableStreamSpec:
    """The spec parsed once, with every default filled in: the typed view every renderer,
    status and rollout step reads. A spec already parsed is returned as it is.

    ``image`` and ``imagePullSecrets`` left out (or empty) come from the operator's
    settings, read at each parse: a new operator version rolls the servers onto its image.
    """
    if isinstance(spec, DurableStreamSpec):
        return spec
    given = copy.deepcopy(dict(spec or {}))
    raw = _merge(copy.deepcopy(DEFAULTS), given)
    for path, value in (NESTED_DEFAULTS | LATER_DEFAULTS).items():
        parent = _parent(raw, path)
        if parent is not None and parent.get(path[-1]) is None:
            parent[path[-1]] = copy.deepcopy(value)
    if given.get("resources") is not None:
        # Given resources replace the defaults whole, as the CRD's default does (it applies
        # only to a spec without them): merged, limits.memory 128Mi kept the default
        # request of 256Mi, a pod the API server refuses (request above limit).
        raw["resources"] = given["resources"]
    if not raw.get("image"):
        raw["image"] = operator_image()
    if not raw.get("imagePullSecrets"):
        names = os.environ.get(SERVER_PULL_SECRETS_ENV, "").split(",")
        raw["imagePullSecrets"] = [{"name": n.strip()} for n in names if n.strip()]
    return DurableStreamSpec(
        raw=raw,
        image=str(raw["image"]),
        image_pull_policy=str(raw["imagePullPolicy"]),
        image_pull_secrets=tuple(raw["imagePullSecrets"]),
        replicas=int(raw["replicas"]),
        primary_update_strategy=str(raw["primaryUpdateStrategy"]),
        storage=_storage(raw["storage"]),
        resources=raw["resources"],
        server=_server(raw["server"]),
        scheduling=raw["scheduling"],
        template=raw.get("template") or {},
        replication=_replication(raw["replication"]),
        service=ServiceSpec(type=str(raw["service"]["type"]), port=int(raw["service"]["port"])),
        metrics=_metrics(raw["metrics"]),
        lifecycle=_lifecycle(raw["lifecycle"]),
        certificates=_certificates(raw.get("certificates") or {}),
        analytics=raw.get("analytics") or {},
        backup=archive_spec.backup(raw.get("backup")),
        recovery=archive_spec.recovery(raw.get("bootstrap")),
        replica=archive_spec.replica(raw.get("replica")),
    )


def operator_image() -> str:
    """The server image for a spec that names none (``SERVER_IMAGE_ENV``)."""
    return os.environ.get(SERVER_IMAGE_ENV) or DEFAULT_IMAGE


# On a DurableStream: its replica set served plain HTTP before the operator made the
# built-in CA the default, and keeps doing so until ``certificates.builtIn`` says
# otherwise (builtin_tls.keep_plain_http): its clients' http:// URLs keep working.
PLAIN_HTTP = f"{GROUP}/plain-http"


def spec_of(body: Mapping[str, Any]) -> DurableStreamSpec:
    """A DurableStream's spec (``body``: the object as the API returns it), parsed, with
    ``certificates.builtIn: false`` where the object keeps plain HTTP (``PLAIN_HTTP``)
    and its spec does not choose."""
    raw = body.get("spec")
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    certs = dict((raw or {}).get("certificates") or {})
    if annotations.get(PLAIN_HTTP) == "true" and "builtIn" not in certs:
        raw = {**(raw or {}), "certificates": {**certs, "builtIn": False}}
    return with_defaults(raw)


def hashed(spec: SpecInput) -> dict[str, Any]:
    """The defaulted spec as the config hash sees it: a ``LATER_DEFAULTS`` field holding
    its default left out, as it was before the CRD had it (a copy)."""
    raw = copy.deepcopy(dict(with_defaults(spec).raw))
    for path, value in LATER_DEFAULTS.items():
        parent = _parent(raw, path)
        if parent is not None and path[-1] in parent and parent[path[-1]] == value:
            del parent[path[-1]]
    return raw


def _parent(raw: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    """The object holding ``path``'s last field, or None where an object on the way is
    missing (a default applies only where its parent exists)."""
    node: Any = raw
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base


def _optional_str(value: Any) -> str | None:
    return str(value) if value else None


def _storage(raw: Mapping[str, Any]) -> StorageSpec:
    return StorageSpec(
        size=str(raw["size"]),
        pvc_retention=str(raw["pvcRetention"]),
        storage_class_name=_optional_str(raw.get("storageClassName")),
    )


def _server(raw: Mapping[str, Any]) -> ServerSpec:
    auth = raw.get("authTokensSecret") or None
    rate = raw.get("rateLimit") or None
    subscriptions = raw.get("subscriptions") or {}
    return ServerSpec(
        long_poll_timeout_seconds=int(raw["longPollTimeoutSeconds"]),
        sse_reconnect_interval_seconds=int(raw["sseReconnectIntervalSeconds"]),
        max_body_bytes=int(raw["maxBodyBytes"]),
        default_ttl_seconds=int(raw["defaultTTLSeconds"]),
        log_level=str(raw["logLevel"]),
        log_format=str(raw["logFormat"]),
        auth_tokens=(
            None
            if auth is None
            else SecretKey(
                name=str(auth.get("name") or ""), key=str(auth.get("key") or AUTH_TOKENS_KEY)
            )
        ),
        tls_secret_name=_optional_str(raw.get("tlsSecretName")),
        rate_limit=(
            None
            if rate is None
            else RateLimitSpec(
                requests_per_second=rate.get("requestsPerSecond", 0),
                burst=int(rate.get("burst", RATE_BURST)),
            )
        ),
        webhook_allow=tuple(str(h) for h in subscriptions.get("webhookAllow") or ()),
        public_url=_optional_str(subscriptions.get("publicURL")),
        retention=tuple(
            RetentionRule(
                prefix=str(entry.get("prefix", "")),
                max_bytes=_optional_str(entry.get("maxBytes")),
                max_age=_optional_str(entry.get("maxAge")),
            )
            for entry in raw.get("retention") or ()
        ),
        workers=None if raw.get("workers") is None else int(raw["workers"]),
        settings=dict(raw.get("settings") or {}),
        webhook_ca=(
            None
            if not (ca := subscriptions.get("webhookCA"))
            else SecretKey(name=str(ca["name"]), key=str(ca["key"]))
        ),
    )


def _replication(raw: Mapping[str, Any]) -> ReplicationSpec:
    staleness = raw.get("readStalenessSeconds")
    return ReplicationSpec(
        min_in_sync=int(raw["minInSync"]),
        durability=str(raw["durability"]),
        lease_duration_seconds=int(raw["leaseDurationSeconds"]),
        renew_deadline_seconds=int(raw["renewDeadlineSeconds"]),
        retry_period_seconds=int(raw["retryPeriodSeconds"]),
        read_staleness_seconds=None if staleness is None else staleness,
    )


def _monitor(raw: Mapping[str, Any] | None) -> MonitorSpec:
    raw = raw or {}
    return MonitorSpec(
        enabled=bool(raw.get("enabled")),
        interval=_optional_str(raw.get("interval")),
        labels=dict(raw.get("labels") or {}),
        tls_config=dict(raw.get("tlsConfig") or {}),
    )


def _metrics(raw: Mapping[str, Any]) -> MetricsSpec:
    return MetricsSpec(pod_monitor=_monitor(raw.get("podMonitor")))


def _lifecycle(raw: Mapping[str, Any]) -> LifecycleSpec:
    return LifecycleSpec(
        startup_timeout_seconds=int(raw["startupTimeoutSeconds"]),
        termination_grace_period_seconds=int(raw["terminationGracePeriodSeconds"]),
        readiness_period_seconds=int(raw["readinessPeriodSeconds"]),
        readiness_failure_threshold=int(raw["readinessFailureThreshold"]),
        liveness_period_seconds=int(raw["livenessPeriodSeconds"]),
        liveness_failure_threshold=int(raw["livenessFailureThreshold"]),
    )


def _certificates(raw: Mapping[str, Any]) -> CertificatesSpec:
    ref = raw.get("issuerRef") or {}
    return CertificatesSpec(
        issuer_ref=(
            IssuerRef(
                name=str(ref["name"]),
                kind=str(ref.get("kind") or ISSUER_KIND),
                group=str(ref.get("group") or CERT_MANAGER_GROUP),
            )
            if ref.get("name")
            else None
        ),
        secret_name=_optional_str(raw.get("secretName")),
        duration=_optional_str(raw.get("duration")),
        renew_before=_optional_str(raw.get("renewBefore")),
        built_in=raw.get("builtIn") is not False,
    )


# The server's limit on a replica set (stream_server.replication.settings.MAX_SET_SIZE).
MAX_REPLICAS = 5


def replicated(spec: SpecInput) -> bool:
    """Whether the spec asks for a replica set (``DurableStreamSpec.replicated``)."""
    return with_defaults(spec).replicated


def min_in_sync(spec: SpecInput) -> int:
    """The in-sync count a write waits for (``DurableStreamSpec.min_in_sync``)."""
    return with_defaults(spec).min_in_sync


def refused_change(old: Mapping[str, Any] | None, new: SpecInput) -> str | None:
    """Why the operator will not carry out ``old -> new``, or None if it can. ``old``: the
    spec last applied, as the StatefulSet's annotation holds it (its storage)."""
    spec = with_defaults(new)
    invalid = (
        refused_workers(spec)
        or server_settings.refused_settings(spec.server.settings)
        or pod_template.refused_template(spec.template)
        or refused_retention(spec)
        or refused_replication(spec)
        or archive_spec.refused_archive(spec.backup, spec.recovery, spec.replica)
    )
    if invalid or not old:
        return invalid
    if (old.get("bootstrap") or None) != (spec.raw.get("bootstrap") or None):
        return "bootstrap cannot change: it says how the set was first made"
    o, n = with_defaults(old).storage, spec.storage
    if o.storage_class_name != n.storage_class_name:
        return "storage.storageClassName cannot change: volumes cannot move between classes"
    if quantities.as_bytes(n.size) < quantities.as_bytes(o.size):
        return f"storage.size cannot shrink ({o.size} -> {n.size}): volumes can only grow"
    return None


def refused_workers(spec: SpecInput) -> str | None:
    """What the CRD's minimum on ``server.workers`` refuses, for a cluster that did not
    run it: the server would refuse to start."""
    workers = with_defaults(spec).server.workers
    if workers is not None and workers < 0:
        return f"server.workers ({workers}) must be 0 (one per CPU) or more"
    return None


def refused_retention(spec: SpecInput) -> str | None:
    """What the CRD's rules on ``server.retention`` refuse (a rule per entry, each prefix
    once), for a cluster that did not run them: the server would refuse to start."""
    seen: set[str] = set()
    for i, rule in enumerate(with_defaults(spec).server.retention):
        if not (rule.max_bytes or rule.max_age):
            return (
                f"server.retention[{i}] (prefix {rule.prefix!r}) sets neither maxBytes nor maxAge"
            )
        if rule.prefix in seen:
            return f"server.retention[{i}]: prefix {rule.prefix!r} is given more than once"
        seen.add(rule.prefix)
    return None


def refused_replication(spec: SpecInput) -> str | None:
    """What the CRD's ranges and rules on ``replicas`` and ``replication`` refuse, for a
    cluster that did not run them: the server would refuse to start (or, for a scale-down
    below the in-sync count, no write could ever be acknowledged)."""
    s = with_defaults(spec)
    rep, replicas = s.replication, s.replicas
    if not 1 <= replicas <= MAX_REPLICAS:
        return f"replicas must be 1 to {MAX_REPLICAS} (the copies of one replica set)"
    if rep.durability not in ("required", "preferred"):
        return "replication.durability must be required or preferred"
    if not 0 <= rep.min_in_sync <= replicas:
        return (
            f"replication.minInSync ({rep.min_in_sync}) is more than replicas ({replicas}): "
            "no write could be acknowledged; lower minInSync before scaling down"
        )
    if not rep.renew_deadline_seconds < rep.lease_duration_seconds:
        return "replication.renewDeadlineSeconds must be less than leaseDurationSeconds"
    if not rep.retry_period_seconds < rep.renew_deadline_seconds:
        return "replication.retryPeriodSeconds must be less than renewDeadlineSeconds"
    staleness = rep.read_staleness_seconds
    # The server's rule (replication/settings.py): more than two commit-point heartbeats.
    beat = min(1.0, rep.renew_deadline_seconds / 4)
    if staleness is not None and not float(staleness) > 2 * beat:
        return (
            f"replication.readStalenessSeconds ({staleness}) must be more than twice the "
            f"commit-point heartbeat ({beat:g} s)"
        )
    return None
