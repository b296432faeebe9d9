"""The DurableStream spec with its defaults, and the changes the operator refuses.

The CRD schema carries the same defaults and ranges (and CEL rules for the
immutable fields), so a cluster validates before the operator sees anything;
these functions are the operator's own check, for clusters and paths where
the schema did not run.
"""

from __future__ import annotations

import copy
import re
from typing import Any

DEFAULT_IMAGE = "durable-streams-py:0.1.0"
DEFAULTS: dict[str, Any] = {
    "image": DEFAULT_IMAGE,
    "imagePullPolicy": "IfNotPresent",
    "replicas": 1,
    "storage": {"size": "10Gi", "pvcRetention": "Retain"},
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "server": {
        "longPollTimeoutSeconds": 30,
        "sseReconnectIntervalSeconds": 60,
        "maxBodyBytes": 64 * 1024 * 1024,
        "defaultTTLSeconds": 0,
        "logLevel": "info",
        "logFormat": "json",
    },
    "scheduling": {},
    "service": {"type": "ClusterIP", "port": 4437},
    "metrics": {"serviceMonitor": {"enabled": False, "interval": "30s"}},
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
    """The spec with every default filled in (deep, without touching the input)."""
    return _merge(copy.deepcopy(DEFAULTS), copy.deepcopy(dict(spec or {})))


def _merge(base: dict, over: dict) -> dict:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base


def quantity_bytes(value: str) -> int:
    m = _QUANTITY.match(str(value).strip())
    if m is None:
        raise ValueError(f"not a storage quantity: {value!r}")
    return int(float(m.group(1)) * _FACTORS[m.group(2)])


def refused_change(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """Why the operator will not carry out ``old -> new``, or None if it can."""
    if not old:
        return None
    o, n = with_defaults(old), with_defaults(new)
    if o["storage"].get("storageClassName") != n["storage"].get("storageClassName"):
        return "storage.storageClassName cannot change: volumes cannot move between classes"
    if quantity_bytes(n["storage"]["size"]) < quantity_bytes(o["storage"]["size"]):
        return (
            f"storage.size cannot shrink ({o['storage']['size']} -> {n['storage']['size']}): "
            "volumes can only grow"
        )
    return None
