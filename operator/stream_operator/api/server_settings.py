"""Every server setting, as the operator reaches it: ``spec.server.settings`` (a map
keyed by the setting's flag name, as CloudNativePG's ``postgresql.parameters``), a
typed spec field, or a value the operator owns (the pod's layout decides it).

The operator may not import the server (pyproject's import contracts), so the server's
declaration (``stream_server.config.declaration``) is mirrored here as a table:
``FREE`` holds each setting the map may set with the kind and bounds of the server's
own checks, ``SPEC_FIELDS`` the ones a typed field sets (the map refuses them, naming
the field), ``OWNED`` the ones the operator sets itself (refused, saying why).
tests/operator/test_server_settings_table.py checks that the three cover every
declared setting exactly once and that this table accepts and refuses what the
server's own parser and checks do. A value the server would refuse at start (a crash
loop) is refused here instead: the change is not applied and ``Accepted`` says why.

Checks across settings (``--retention`` against ``--max-path-bytes``) and those that
look at the pod (``--workers`` per CPU, ``--max-connections`` against the open-file
limit) are the server's alone: a pod that fails them says so in its status.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT_MAX = 2**63 - 1
MAX_SECONDS = threading.TIMEOUT_MAX  # the server's bound on a duration (checks.MAX_SECONDS)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Kind:
    """What one setting's value may be: the server's type and its static check."""

    type: type  # int, float, bool or str, as the server's default
    low: float = 0  # int: the least allowed; float: the least (exclusive when positive)
    high: float = INT_MAX
    positive: bool = False  # float: must be more than ``low`` (0)

    def refused(self, text: str) -> str | None:
        """Why the server would refuse ``text`` (its parser, then its check), or None."""
        if self.type is bool:
            return None if text.strip().lower() in _TRUE + _FALSE else "must be true or false"
        if self.type is str:
            return None
        try:
            value: float = int(text) if self.type is int else float(text)
        except ValueError:
            return "must be a whole number" if self.type is int else "must be a number"
        if self.type is float and not math.isfinite(value):
            return "must be a finite number"
        if self.positive and value <= self.low:
            return "must be positive"
        if not self.low <= value <= self.high:
            return f"must be {self.low:g} to {self.high:g}"
        return None


def _whole(low: int, high: int = INT_MAX) -> Kind:
    return Kind(int, low, high)


COUNT, NONE_OR_MORE = _whole(1), _whole(0)
SECONDS = Kind(float, 0, MAX_SECONDS, positive=True)
SECONDS_OR_ZERO = Kind(float, 0, MAX_SECONDS)

# Settable through spec.server.settings, by flag name (no leading --).
FREE: dict[str, Kind] = {
    "reload-interval": SECONDS,
    "keep-alive-timeout": SECONDS,
    "header-timeout": SECONDS,
    "body-timeout": SECONDS,
    "min-body-rate": NONE_OR_MORE,
    "max-connections": NONE_OR_MORE,
    "max-read-bytes": COUNT,
    "max-path-bytes": COUNT,
    "max-header-bytes": _whole(1, 1024**2),
    "max-headers": COUNT,
    "max-json-messages": COUNT,
    "max-streams": NONE_OR_MORE,
    "hot-streams": COUNT,
    "max-producers-per-stream": COUNT,
    "max-fork-depth": COUNT,
    "max-live-readers": NONE_OR_MORE,
    "max-live-readers-per-client": NONE_OR_MORE,
    "lmdb-map-size": _whole(64 * 1024, 2**46),
    "checkpoint-frames": COUNT,
    "checkpoint-interval": SECONDS,
    "slow-append-seconds": SECONDS_OR_ZERO,
    "metrics": Kind(bool),
    "max-subscriptions": COUNT,
    "webhook-timeout": SECONDS,
    "webhook-key-replay-window": SECONDS_OR_ZERO,
    "webhook-key-rotation-interval": SECONDS_OR_ZERO,
    "replication-wait": SECONDS_OR_ZERO,
    "archive-region": Kind(str),
    "archive-object-bytes": _whole(4096, 5 * 1024**3),
    "archive-max-pending-bytes": _whole(1024 * 1024),
}

# Set by a typed spec field: the map refuses them, naming it.
SPEC_FIELDS: dict[str, str] = {
    "workers": "server.workers",
    "long-poll-timeout": "server.longPollTimeoutSeconds",
    "sse-reconnect-interval": "server.sseReconnectIntervalSeconds",
    "max-body-bytes": "server.maxBodyBytes",
    "default-ttl": "server.defaultTTLSeconds",
    "log-level": "server.logLevel",
    "log-format": "server.logFormat",
    "rate-limit": "server.rateLimit.requestsPerSecond",
    "rate-burst": "server.rateLimit.burst",
    "public-url": "server.subscriptions.publicURL",
    "webhook-allow": "server.subscriptions.webhookAllow",
    "webhook-ca-file": "server.subscriptions.webhookCA",
    "retention": "server.retention",
    "auth-tokens-file": "server.authTokensSecret",
    "tls-cert": "server.tlsSecretName or certificates.issuerRef",
    "tls-key": "server.tlsSecretName or certificates.issuerRef",
    "replication-set-size": "replicas",
    "min-in-sync": "replication.minInSync",
    "replication-durability": "replication.durability",
    "lease-duration": "replication.leaseDurationSeconds",
    "lease-renew-deadline": "replication.renewDeadlineSeconds",
    "lease-retry-period": "replication.retryPeriodSeconds",
    "replication-read-staleness": "replication.readStalenessSeconds",
    "archive-url": "backup.objectStore.destinationPath",
    "archive-endpoint": "backup.objectStore.endpointURL",
    "archive-ca-bundle": "backup.objectStore.endpointCA",
    "archive-timeout": "backup.archiveTimeout",
    "archive-mode": "backup.archiveMode",
    "backup-retention": "backup.retentionPolicy",
    "archive-follow": "replica.enabled",
}

# Decided by the pod's layout: refused, with the reason.
OWNED: dict[str, str] = {
    "host": "the pod listens on its own address (0.0.0.0)",
    "port": "the container port, which the Services and probes target",
    "base-path": "the Services' clients, status.endpoint and the PodMonitor use /v1/stream/",
    "data-dir": "the volume's mount",
    "fence-file": "the downward-API volume the operator fences pods through",
    "replication-lease": "the Lease <name>-leader the operator makes",
    "replica-name": "each pod's own name",
    "replica-url": "each pod's address through the headless Service",
    "replication-pod": "each pod's own name",
    "kube-api": "the in-cluster service account",
    "replication-token-file": "the peer-token Secret the operator makes",
    "replication-ca-file": "the CA of the server's TLS Secret",
    "replication-bootstrap": "pod 0 starts a new set",
    "replication-cert-file": "a file in the pod: no spec field mounts one yet",
    "replication-key-file": "a file in the pod: no spec field mounts one yet",
}


def env_name(flag: str) -> str:
    """A setting's variable, as the server names it (``DS_`` and the name upper-cased)."""
    return "DS_" + flag.replace("-", "_").upper()


def as_text(value: Any) -> str:
    """A value from the spec as the server's variable holds it (YAML's true: ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def refused_settings(settings: Mapping[str, Any]) -> str | None:
    """Why ``spec.server.settings`` cannot be rendered, or None: an unknown name, one a
    spec field or the operator sets, or a value the server would refuse."""
    for flag in sorted(settings):
        where = f"server.settings.{flag}"
        if flag in SPEC_FIELDS:
            return f"{where}: set it with spec.{SPEC_FIELDS[flag]}"
        if flag in OWNED:
            return f"{where}: the operator sets it ({OWNED[flag]})"
        kind = FREE.get(flag.removeprefix("--"))
        if kind is None:
            return (
                f"{where}: not a server setting (names are the server's flags without --, "
                "e.g. max-streams; `durable-streams-server serve --help` lists them)"
            )
        if flag.startswith("--"):
            return f"{where}: name it without the leading --"
        value = settings[flag]
        if value is None or isinstance(value, (dict, list)):
            return f"{where}: give one value (a string, number or true/false)"
        if problem := kind.refused(as_text(value)):
            return f"{where} {problem} (given {as_text(value)!r})"
    return None


def settings_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """The map as the server's variables (refused_settings has passed it)."""
    return {env_name(flag): as_text(value) for flag, value in settings.items()}
