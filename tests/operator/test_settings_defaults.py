"""The operator's defaults for the server's settings, and the CRD's, are the server's own.

The operator may not import the server (pyproject's import contracts), so its
defaults (``stream_operator.api.spec``) and the CRD's ``default:`` values are written out a
second and a third time; a drift between them and ``stream_server.config.Settings``
would be silent in production: a DurableStream left at its defaults would run a server
that differs from one started by hand. This test imports both sides and checks every
setting the operator renders into the server's environment.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_operator.api import spec
from stream_operator.api.spec import with_defaults
from stream_operator.specs.render import replication_env, server_env
from stream_server.config import Settings

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "charts" / "durable-streams" / "files" / "crds" / "durablestreams.yaml"

# Each variable whose value comes from a spec field, and that field's path in the spec.
FROM_THE_SPEC: dict[str, tuple[str, ...]] = {
    "DS_LONG_POLL_TIMEOUT": ("server", "longPollTimeoutSeconds"),
    "DS_SSE_RECONNECT_INTERVAL": ("server", "sseReconnectIntervalSeconds"),
    "DS_MAX_BODY_BYTES": ("server", "maxBodyBytes"),
    "DS_DEFAULT_TTL": ("server", "defaultTTLSeconds"),
    "DS_LOG_LEVEL": ("server", "logLevel"),
    "DS_LOG_FORMAT": ("server", "logFormat"),
    "DS_RATE_LIMIT": ("server", "rateLimit", "requestsPerSecond"),
    "DS_RATE_BURST": ("server", "rateLimit", "burst"),
    "DS_WEBHOOK_ALLOW": ("server", "subscriptions", "webhookAllow"),
    "DS_PUBLIC_URL": ("server", "subscriptions", "publicURL"),
    "DS_RETENTION": ("server", "retention"),
    "DS_MIN_IN_SYNC": ("replication", "minInSync"),
    "DS_REPLICATION_DURABILITY": ("replication", "durability"),
    "DS_LEASE_DURATION": ("replication", "leaseDurationSeconds"),
    "DS_LEASE_RENEW_DEADLINE": ("replication", "renewDeadlineSeconds"),
    "DS_LEASE_RETRY_PERIOD": ("replication", "retryPeriodSeconds"),
    "DS_REPLICATION_READ_STALENESS": ("replication", "readStalenessSeconds"),
}
# Variables the pod's layout decides (addresses, mounts, names), not a default.
FROM_THE_POD = {
    "DS_HOST",  # a pod listens on its own address, not on loopback
    "DS_PORT",  # the container port, the Services' target
    "DS_DATA_DIR",  # the volume's mount
    "DS_AUTH_TOKENS_FILE",
    "DS_TLS_CERT",
    "DS_TLS_KEY",
    "DS_REPLICATION_CA_FILE",
    "DS_REPLICATION_TOKEN_FILE",
    "DS_REPLICATION_LEASE",
    "DS_REPLICATION_SET_SIZE",  # spec.replicas
    "DS_REPLICATION_BOOTSTRAP",
    "DS_WORKERS",  # the pod's CPU limit, or one process without one (test_workers_render.py)
}
# Defaults that differ from the server's on purpose, and why.
ON_PURPOSE = {
    # A cluster's log collector parses one JSON object a line; a laptop's reader wants text.
    "DS_LOG_FORMAT": "json",
}
# A spec with every optional object present but none of its optional fields: what the
# operator renders for it is its defaults.
BARE = {
    "replicas": 3,
    "server": {"authTokensSecret": {"name": "tokens"}, "tlsSecretName": "tls"},
}


def bare(variable: str) -> dict[str, Any]:
    """BARE, with a rate limit (rendered only when given) that leaves ``variable``'s field
    to its default: its other field is given."""
    other = {"requestsPerSecond": 7} if variable == "DS_RATE_BURST" else {"burst": 7}
    return {**BARE, "server": {**BARE["server"], "rateLimit": other}}


# Every field set, so that every variable the operator can render is rendered.
FULL = {
    **BARE,
    "server": {
        **BARE["server"],
        "rateLimit": {"requestsPerSecond": 5, "burst": 10},
        "subscriptions": {"webhookAllow": ["h.ns.svc"], "publicURL": "http://e.ns.svc:4437"},
        "retention": [{"prefix": "logs/", "maxAge": "7d"}],
    },
    "replication": {"readStalenessSeconds": 9},
}
FIELDS = {f"DS_{f.name.upper()}": f for f in dataclasses.fields(Settings)}


def rendered(spec: dict[str, Any]) -> dict[str, str]:
    parsed = with_defaults(spec)
    return {**server_env(parsed), **replication_env("ev", "ns", parsed)}


def server_default(variable: str) -> Any:
    f = FIELDS[variable]
    assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def as_setting(variable: str, value: str) -> Any:
    """A rendered value as the server's field holds it (its default's type)."""
    default = server_default(variable)
    if isinstance(default, list):
        return [v for v in value.split(",") if v]
    return type(default)(value)


def crd_defaults() -> dict[tuple[str, ...], Any]:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    out: dict[tuple[str, ...], Any] = {}

    def walk(schema: dict[str, Any], path: tuple[str, ...]) -> None:
        if "default" in schema:
            out[path] = schema["default"]
        for name, sub in (schema.get("properties") or {}).items():
            walk(sub, (*path, name))

    walk(version["schema"]["openAPIV3Schema"]["properties"]["spec"], ())
    return out


def test_every_variable_the_operator_renders_is_a_server_setting_of_known_origin():
    env = rendered(FULL)
    assert set(env) == set(FROM_THE_SPEC) | FROM_THE_POD
    assert set(env) <= set(FIELDS), set(env) - set(FIELDS)


@pytest.mark.parametrize("variable", sorted(FROM_THE_SPEC))
def test_the_operators_default_is_the_servers(variable: str):
    path = FROM_THE_SPEC[variable]
    env = rendered(bare(variable))
    if variable not in env:
        # No default in the operator: left out, the server's own holds (and the CRD
        # must not default it either, or the two would differ by path).
        assert path not in crd_defaults(), path
        return
    if variable == "DS_MIN_IN_SYNC":
        # Rendered resolved (the set size is known): 0, the server's default, is a majority.
        assert server_default(variable) == 0 and with_defaults(BARE).replication.min_in_sync == 0
        assert int(env[variable]) == BARE["replicas"] // 2 + 1
        return
    value = as_setting(variable, env[variable])
    if variable in ON_PURPOSE:
        assert value == ON_PURPOSE[variable] != server_default(variable)
    else:
        assert value == server_default(variable), (variable, value, server_default(variable))


@pytest.mark.parametrize("variable", sorted(FROM_THE_SPEC))
def test_the_crds_default_is_the_operators(variable: str):
    path = FROM_THE_SPEC[variable]
    crd = crd_defaults()
    if path not in crd:
        return  # no default in the schema: the operator's (or the server's) applies
    env = rendered(bare(variable))
    assert variable in env, f"the CRD defaults {path} but the operator renders no default"
    if variable == "DS_MIN_IN_SYNC":  # rendered resolved: see above
        assert crd[path] == with_defaults(BARE).replication.min_in_sync
        return
    assert as_setting(variable, env[variable]) == as_setting(variable, str(crd[path]))


def test_the_defaults_inside_optional_objects_are_the_crds():
    """The CRD's, which the API server sets where the object is given; the parse sets
    the same into the spec it hashes (``spec.NESTED_DEFAULTS``), so a spec stored with or
    without them rolls no pod (test_crd_schema.py)."""
    crd = crd_defaults()
    assert {p: crd[p] for p in spec.NESTED_DEFAULTS} == spec.NESTED_DEFAULTS
    assert crd[("server", "authTokensSecret", "key")] == spec.AUTH_TOKENS_KEY
    assert crd[("server", "rateLimit", "burst")] == spec.RATE_BURST
    assert crd[("certificates", "issuerRef", "kind")] == spec.ISSUER_KIND
    assert crd[("certificates", "issuerRef", "group")] == spec.CERT_MANAGER_GROUP
    given = with_defaults(
        {
            "server": {"authTokensSecret": {"name": "t"}},
            "certificates": {"issuerRef": {"name": "i"}},
        }
    )
    assert given.server.auth_tokens is not None
    assert given.server.auth_tokens.key == spec.AUTH_TOKENS_KEY
    assert given.certificates.issuer_ref is not None
    assert (given.certificates.issuer_ref.kind, given.certificates.issuer_ref.group) == (
        spec.ISSUER_KIND,
        spec.CERT_MANAGER_GROUP,
    )
