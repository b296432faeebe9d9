"""The operator's own settings (``DS_OPERATOR_*`` variables), read and checked once.

A bad value stops the operator at start with one line naming the variable and the value
(``python -m stream_operator`` exits 2), never with a traceback from deep inside an import
or, worse, silently: before this module, ``DS_OPERATOR_LEADER_ELECTION=yes`` turned leader
election *off* and ``DS_OPERATOR_STALL_SECONDS=0`` made ``/healthz`` fail on every round.
A ``DS_OPERATOR_`` variable the operator does not know (a typo) is refused too, as the
server refuses an unknown ``DS_`` one.

``load`` parses the environment (``__main__`` calls it first, ``testkit.operator`` when it
starts the operator in-process); ``current`` is what the modules read, when they run, not
when they are imported.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "DS_OPERATOR_"


class SettingError(ValueError):
    """A variable with a value the operator cannot run with; the message names both."""


@dataclass(frozen=True)
class OperatorSettings:
    # One request of the handlers to the API server (seconds, connecting and answering).
    api_timeout: float = 10.0
    # How often each DurableStream's status is compared with its pods (seconds).
    status_interval: float = 5.0
    # How often each DurableStream is reconciled again, to undo drift (seconds).
    resync_interval: float = 60.0
    # Worker threads of the periodic rounds: this many hung objects hold up the rest.
    periodic_workers: int = 4
    # A worker on one object for this long is stuck: /healthz fails (seconds).
    stall_seconds: float = 300.0
    metrics_port: int = 8081  # /metrics and /healthz; 0 turns them off
    leader_election: bool = True
    unpinned_server_image: str = "roll"  # server_image: roll or hold
    # The server pods run as the image's UID 10001; false where the platform assigns one
    # (OpenShift's restricted SCC): pod_template.pod_security_context.
    server_fixed_uid: bool = True
    # Labels on every PodMonitor (JSON object of strings).
    monitor_labels: Mapping[str, str] = field(default_factory=dict)
    # A replica set's peer token is rotated this often (seconds; token_rotation.py).
    peer_token_rotation: float = 30 * 86400.0
    # A NetworkPolicy per DurableStream unless its spec.networkPolicy.enabled says no.
    network_policies: bool = True
    # The operator's own namespace (the downward API's POD_NAMESPACE; empty outside a
    # pod): the DurableStreams' NetworkPolicies let its pod in from there.
    namespace: str = ""


def _float(raw: str, what: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"must be {what}") from None


def _int(raw: str, what: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"must be {what}") from None


def _seconds(raw: str) -> float:
    value = _float(raw, "a positive number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number of seconds")
    return value


def _at_least_one(raw: str) -> int:
    value = _int(raw, "a whole number of at least 1")
    if value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


def _port(raw: str) -> int:
    value = _int(raw, "a port number from 0 (off) to 65535")
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number from 0 (off) to 65535")
    return value


def _boolean(raw: str) -> bool:
    word = raw.strip().lower()
    if word not in ("true", "false"):
        raise ValueError("must be true or false")
    return word == "true"


def _policy(raw: str) -> str:
    word = raw.strip().lower()
    if word not in ("roll", "hold"):
        raise ValueError("must be roll or hold")
    return word


def _labels(raw: str) -> dict[str, str]:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError('must be a JSON object of strings, e.g. {"release": "prometheus"}')
    return value


# variable -> (field, parser); the later of two variables for one field wins.
PARSED: dict[str, tuple[str, Callable[[str], Any]]] = {
    "DS_OPERATOR_API_TIMEOUT": ("api_timeout", _seconds),
    "DS_OPERATOR_STATUS_INTERVAL": ("status_interval", _seconds),
    "DS_OPERATOR_RESYNC_INTERVAL": ("resync_interval", _seconds),
    "DS_OPERATOR_PERIODIC_WORKERS": ("periodic_workers", _at_least_one),
    "DS_OPERATOR_STALL_SECONDS": ("stall_seconds", _seconds),
    "DS_OPERATOR_METRICS_PORT": ("metrics_port", _port),
    "DS_OPERATOR_LEADER_ELECTION": ("leader_election", _boolean),
    "DS_OPERATOR_UNPINNED_SERVER_IMAGE": ("unpinned_server_image", _policy),
    "DS_OPERATOR_SERVER_FIXED_UID": ("server_fixed_uid", _boolean),
    "DS_OPERATOR_PODMONITOR_LABELS": ("monitor_labels", _labels),
    "DS_OPERATOR_PEER_TOKEN_ROTATION": ("peer_token_rotation", _seconds),
    "DS_OPERATOR_NETWORK_POLICIES": ("network_policies", _boolean),
    "POD_NAMESPACE": ("namespace", str),
}
# Read where they are used, as text any value of which is valid.
TEXT = (
    "DS_OPERATOR_METRICS_ADDRESS",
    "DS_OPERATOR_LEASE_NAME",
    "DS_OPERATOR_SERVER_IMAGE",
    "DS_OPERATOR_SERVER_IMAGE_PULL_SECRETS",
)


def parse(env: Mapping[str, str]) -> OperatorSettings:
    """The settings ``env`` gives; SettingError for the first bad or unknown variable."""
    known = (*PARSED, *TEXT)
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise SettingError(f"unknown setting {name}{hint}")
    values: dict[str, Any] = {}
    for name, (attr, parser) in PARSED.items():
        raw = env.get(name)
        if raw is None or (attr == "monitor_labels" and not raw):
            continue
        try:
            values[attr] = parser(raw)
        except ValueError as exc:
            raise SettingError(f"{name}={raw!r}: {exc}") from None
    return OperatorSettings(**values)


_current: OperatorSettings | None = None


def load(env: Mapping[str, str] | None = None) -> OperatorSettings:
    """Parse ``env`` (the process's environment) and make it what ``current`` answers."""
    global _current
    _current = parse(os.environ if env is None else env)
    return _current


def current() -> OperatorSettings:
    """The settings loaded last (the environment's, parsed on first use)."""
    return _current if _current is not None else load()
