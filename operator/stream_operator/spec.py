"""The DurableStream spec with its defaults, and the changes the operator refuses.

The CRD schema carries the same defaults and ranges (and CEL rules for the
immutable fields), so a cluster validates before the operator sees anything;
these functions are the operator's own check, for clusters and paths where
the schema did not run.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

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
    # podMonitor's interval has no default: left out, the deprecated serviceMonitor's
    # applies (monitoring.podmonitor_settings).
    "metrics": {
        "podMonitor": {"enabled": False},
        "serviceMonitor": {"enabled": False, "interval": "30s"},
    },
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

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i?|[kmgtpe]|)$")
_FACTORS = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def with_defaults(spec: dict[str, Any] | None) -> dict[str, Any]:
    """The spec with every default filled in (deep, without touching the input).

    ``image`` and ``imagePullSecrets`` left out (or empty) come from the operator's
    settings, read at each call: a new operator version rolls the servers onto its image.
    """
    out = _merge(copy.deepcopy(DEFAULTS), copy.deepcopy(dict(spec or {})))
    if not out.get("image"):
        out["image"] = os.environ.get(SERVER_IMAGE_ENV) or DEFAULT_IMAGE
    if not out.get("imagePullSecrets"):
        names = os.environ.get(SERVER_PULL_SECRETS_ENV, "").split(",")
        out["imagePullSecrets"] = [{"name": n.strip()} for n in names if n.strip()]
    return out


def _merge(base: dict, over: dict) -> dict:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base


# The server's limit on a replica set (stream_server.replication.settings.MAX_SET_SIZE).
MAX_REPLICAS = 5


def replicated(spec: dict[str, Any]) -> bool:
    """Whether the spec asks for a replica set (one primary, standbys, a Lease) rather
    than one server in single-node mode."""
    return int(with_defaults(spec)["replicas"]) > 1


def min_in_sync(spec: dict[str, Any]) -> int:
    """Replicas, the primary included, that must hold a batch before it is acknowledged:
    ``replication.minInSync``, or a majority when it is 0 (as the server counts)."""
    s = with_defaults(spec)
    return int(s["replication"]["minInSync"]) or int(s["replicas"]) // 2 + 1


def quantity_bytes(value: str) -> int:
    m = _QUANTITY.match(str(value).strip())
    if m is None:
        raise ValueError(f"not a storage quantity: {value!r}")
    return int(float(m.group(1)) * _FACTORS[m.group(2)])


def refused_change(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """Why the operator will not carry out ``old -> new``, or None if it can."""
    invalid = refused_retention(new) or refused_replication(new)
    if invalid or not old:
        return invalid
    o, n = with_defaults(old), with_defaults(new)
    if o["storage"].get("storageClassName") != n["storage"].get("storageClassName"):
        return "storage.storageClassName cannot change: volumes cannot move between classes"
    if quantity_bytes(n["storage"]["size"]) < quantity_bytes(o["storage"]["size"]):
        return (
            f"storage.size cannot shrink ({o['storage']['size']} -> {n['storage']['size']}): "
            "volumes can only grow"
        )
    return None


def refused_retention(spec: dict[str, Any]) -> str | None:
    """What the CRD's rules on ``server.retention`` refuse (a rule per entry, each prefix
    once), for a cluster that did not run them: the server would refuse to start."""
    seen: set[str] = set()
    for i, entry in enumerate(((spec or {}).get("server") or {}).get("retention") or []):
        prefix = entry.get("prefix", "")
        if not (entry.get("maxBytes") or entry.get("maxAge")):
            return f"server.retention[{i}] (prefix {prefix!r}) sets neither maxBytes nor maxAge"
        if prefix in seen:
            return f"server.retention[{i}]: prefix {prefix!r} is given more than once"
        seen.add(prefix)
    return None


def refused_replication(spec: dict[str, Any]) -> str | None:
    """What the CRD's ranges and rules on ``replicas`` and ``replication`` refuse, for a
    cluster that did not run them: the server would refuse to start (or, for a scale-down
    below the in-sync count, no write could ever be acknowledged)."""
    s = with_defaults(spec)
    rep, replicas = s["replication"], int(s["replicas"])
    if not 1 <= replicas <= MAX_REPLICAS:
        return f"replicas must be 1 to {MAX_REPLICAS} (the copies of one replica set)"
    if rep["durability"] not in ("required", "preferred"):
        return "replication.durability must be required or preferred"
    if not 0 <= int(rep["minInSync"]) <= replicas:
        return (
            f"replication.minInSync ({rep['minInSync']}) is more than replicas ({replicas}): "
            "no write could be acknowledged; lower minInSync before scaling down"
        )
    if not int(rep["renewDeadlineSeconds"]) < int(rep["leaseDurationSeconds"]):
        return "replication.renewDeadlineSeconds must be less than leaseDurationSeconds"
    if not int(rep["retryPeriodSeconds"]) < int(rep["renewDeadlineSeconds"]):
        return "replication.retryPeriodSeconds must be less than renewDeadlineSeconds"
    staleness = rep.get("readStalenessSeconds")
    # The server's rule (replication/settings.py): more than two commit-point heartbeats.
    beat = min(1.0, int(rep["renewDeadlineSeconds"]) / 4)
    if staleness is not None and not float(staleness) > 2 * beat:
        return (
            f"replication.readStalenessSeconds ({staleness}) must be more than twice the "
            f"commit-point heartbeat ({beat:g} s)"
        )
    return None
