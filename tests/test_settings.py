"""Settings: flags and DS_* variables, and the contracts with the operator and its CRD.

The operator configures servers only through DS_* variables, and the CRD
carries the same defaults as the operator; a drift between the three would
be silent in production (a setting ignored, a default that differs by path),
so each is checked here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_operator.render import server_env
from stream_operator.spec import DEFAULTS, with_defaults
from stream_server.config import NOT_SETTINGS, add_arguments, env_names, settings_from

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "charts" / "durable-streams" / "files" / "crds" / "durablestreams.yaml"


def parse(argv: list[str], env: dict[str, str]):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from(parser.parse_args(argv), env)


def test_flags_win_over_the_environment_which_wins_over_defaults():
    s = parse(["--port", "5000"], {"DS_PORT": "6000", "DS_MAX_JSON_MESSAGES": "7"})
    assert s.port == 5000 and s.max_json_messages == 7 and s.max_fork_depth == 64


def test_an_unknown_ds_variable_is_refused_with_a_hint():
    with pytest.raises(ValueError, match=r"unknown setting DS_MAX_BODY .*DS_MAX_BODY_BYTES"):
        parse([], {"DS_MAX_BODY": "10"})
    with pytest.raises(ValueError, match="unknown setting DS_NONSENSE"):
        parse([], {"DS_NONSENSE": "1"})
    parse([], {"DS_FAULT": "crash:wal:1", "OTHER": "x"})  # not settings, and not refused
    parse([], {"DS_OPERATOR_STATUS_INTERVAL": "1"})  # the operator's, exported next to ours


def test_the_server_refuses_to_start_on_an_unknown_variable(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "stream_server", "serve", "--data-dir", str(tmp_path / "d")],
        env={"PATH": "/usr/bin:/bin", "DS_LONG_POLL_TIMEOUTS": "5"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown setting DS_LONG_POLL_TIMEOUTS" in proc.stderr
    assert "DS_LONG_POLL_TIMEOUT?" in proc.stderr
    assert not (tmp_path / "d").exists()


def full_spec() -> dict[str, Any]:
    return with_defaults(
        {
            "server": {
                "authTokensSecret": {"name": "tokens"},
                "tlsSecret": "tls",
                "rateLimit": {"requestsPerSecond": 5, "burst": 10},
                "subscriptions": {
                    "webhookAllow": ["receiver.ns.svc", "*.ns.svc", "10.244.0.0/16"],
                    "publicURL": "http://events.ns.svc:4437",
                },
                "retention": [
                    {"prefix": "logs/", "maxBytes": "10Gi", "maxAge": "7d"},
                    {"prefix": "", "maxBytes": "512KiB"},
                ],
            }
        }
    )


def test_every_variable_the_operator_renders_is_a_real_server_setting():
    env = server_env(full_spec())
    known = env_names()
    assert set(env) <= set(known), set(env) - set(known)
    assert not set(env) & NOT_SETTINGS
    # And the server accepts every value the operator renders.
    s = parse([], env)
    assert s.host == "0.0.0.0" and s.rate_limit == 5 and s.log_format == "json"
    assert s.webhook_allow == ["receiver.ns.svc", "*.ns.svc", "10.244.0.0/16"]
    assert s.public_url == "http://events.ns.svc:4437"
    assert s.retention == ["logs/:max-bytes=10GiB,max-age=7d", ":max-bytes=512KiB"]


def crd_defaults(schema: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple, Any]:
    """Every scalar default in an openAPIV3Schema, by its path."""
    out: dict[tuple, Any] = {}
    if "default" in schema and schema["default"] not in ({}, []):
        out.update(leaves(schema["default"], path))  # an object default, leaf by leaf
    for name, sub in (schema.get("properties") or {}).items():
        out.update(crd_defaults(sub, (*path, name)))
    return out


def leaves(d: Any, path: tuple[str, ...] = ()) -> dict[tuple, Any]:
    if isinstance(d, dict) and d:
        out: dict[tuple, Any] = {}
        for k, v in d.items():
            out.update(leaves(v, (*path, k)))
        return out
    return {path: d}


def test_the_crd_defaults_are_the_operators_defaults():
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    crd_side = crd_defaults(spec_schema)
    operator_side = {k: v for k, v in leaves(DEFAULTS).items() if v not in ({}, [])}
    # Defaults the operator holds must be the CRD's, and the CRD holds no other.
    for path, value in operator_side.items():
        assert crd_side.get(path) == value, (path, crd_side.get(path), value)
    extra = {p: v for p, v in crd_side.items() if p not in operator_side}
    # Defaults inside optional objects: certificates.issuerRef's kind and group are the
    # operator's too, applied where it reads them (stream_operator.certificates.issuer_ref).
    assert all(p[0] in ("analytics", "server", "certificates") for p in extra), extra
