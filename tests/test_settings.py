"""Settings: flags and DS_* variables, and the contracts with the operator and its CRD.

The operator configures servers only through DS_* variables, and the CRD
carries the same defaults as the operator; a drift between the three would
be silent in production (a setting ignored, a default that differs by path),
so each is checked here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_operator.api.spec import DEFAULTS, with_defaults
from stream_operator.specs.render import server_env
from stream_server.config import (
    NOT_SETTINGS,
    Settings,
    add_arguments,
    env_names,
    settings_from,
    values_from,
)

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
    # And the server accepts every value the operator renders (the files it names are
    # in the pod, not here: their checks at start are not made).
    s = Settings(**values_from(argparse.Namespace(), env))
    assert s.host == "::" and s.rate_limit == 5 and s.log_format == "json"
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
    # operator's too, applied where it reads them (stream_operator.specs.certificates.issuer_ref).
    assert all(p[0] in ("analytics", "server", "certificates") for p in extra), extra


# --- Every value checked at start, the refusal naming the flag and the variable ---------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        # NaN compares false with everything: every webhook delivery timed out at once.
        (["--webhook-timeout", "nan"], "--webhook-timeout"),
        (["--webhook-timeout", "inf"], "--webhook-timeout"),
        (["--long-poll-timeout", "1e400"], "--long-poll-timeout"),
        # A thread's wait overflows past threading.TIMEOUT_MAX.
        (["--lease-renew-deadline", "1e12"], "--lease-renew-deadline"),
        # The socket layer kept the low 16 bits: 70000 listened on 4464.
        (["--port", "70000"], "--port"),
        (["--port", "-1"], "--port"),
        (["--port", "http"], "--port"),
        (["--public-url", "foo"], "--public-url"),
        (["--public-url", "ftp://x"], "--public-url"),
        (["--public-url", "https://x/?q=1"], "--public-url"),
        (["--replica-url", "ds-0:4437"], "--replica-url"),
        # Retention prefixes no stream path can start with.
        (["--retention", "../:max-age=1d"], "--retention"),
        (["--retention", "__ds/:max-age=1d"], "--retention"),
        (["--retention", "logs//:max-age=1d"], "--retention"),
        # Sizes and ages past what the engine, LMDB, a Lease or the protocol can hold.
        (["--retention", "x/:max-bytes=99999999999TiB"], "--retention"),
        (["--retention", "x/:max-age=999999999999d"], "--retention"),
        (["--default-ttl", str(10**400)], "--default-ttl"),
        (["--lmdb-map-size", str(2**64)], "--lmdb-map-size"),
        (["--lmdb-map-size", "0"], "--lmdb-map-size"),
        # No checkpoint ever, or one per batch.
        (["--checkpoint-frames", "0"], "--checkpoint-frames"),
        (["--checkpoint-interval", "0"], "--checkpoint-interval"),
        (["--checkpoint-interval", "nan"], "--checkpoint-interval"),
        (["--lease-duration", str(2**31)], "--lease-duration"),
        (["--max-body-bytes", str(2**63)], "--max-body-bytes"),
        (["--max-streams", "-1"], "--max-streams"),
        (["--rate-limit", "nan"], "--rate-limit"),
        (["--log-level", "verbose"], "--log-level"),
        (["--log-format", "JSON"], "--log-format"),
        (["--host", ""], "--host"),
    ],
)
def test_a_value_that_cannot_work_is_refused_naming_the_setting(argv, flag):
    env_name = "DS_" + flag[2:].upper().replace("-", "_")
    with pytest.raises(ValueError) as refused:
        parse(argv, {})
    message = str(refused.value)
    assert flag in message and env_name in message, message
    # The same value from the variable is refused the same way.
    with pytest.raises(ValueError, match=flag):
        parse([], {env_name: argv[1]})


def test_the_edges_of_the_ranges_are_taken():
    s = parse(
        ["--port", "65535", "--public-url", "https://streams.example:8443/prefix"],
        {"DS_RETENTION": "lo:max-age=1d;..x/:max-bytes=1GiB;:max-bytes=1MiB"},
    )
    assert s.port == 65535 and s.public_url.endswith("/prefix")
    assert parse(["--port", "0"], {}).port == 0  # any free port
    assert parse(["--lease-duration", str(2**31 - 1)], {}).lease_duration == 2**31 - 1


@pytest.mark.parametrize(
    "name",
    [
        "webhook_ca_file",
        "auth_tokens_file",
        "replication_token_file",
        "replication_ca_file",
    ],
)
def test_a_file_that_is_not_there_is_refused_at_start(tmp_path, name):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} .*cannot be read.*DS_{name.upper()}"):
        parse([flag, str(tmp_path / "missing")], {})


def test_the_tls_files_must_be_there_and_a_ca_bundle_must_hold_a_certificate(tmp_path):
    key = tmp_path / "key.pem"
    key.write_text("not a key\n")
    with pytest.raises(ValueError, match=r"--tls-cert .*cannot be read.*DS_TLS_CERT"):
        parse(["--tls-cert", str(tmp_path / "missing"), "--tls-key", str(key)], {})
    with pytest.raises(ValueError, match="--tls-cert and --tls-key do not load"):
        parse(["--tls-cert", str(key), "--tls-key", str(key)], {})
    with pytest.raises(ValueError, match=r"--webhook-ca-file .*no PEM certificate"):
        parse(["--webhook-ca-file", str(key)], {})


def test_the_real_command_line_exits_before_serving_naming_the_setting(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "stream_server", "serve", "--data-dir", str(tmp_path / "d")],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "DS_WEBHOOK_TIMEOUT": "nan",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--webhook-timeout" in proc.stderr and "DS_WEBHOOK_TIMEOUT" in proc.stderr
    assert not (tmp_path / "d").exists()


# --- The command line's help ----------------------------------------------------------------


def help_of(*command: str) -> str:
    from stream_server.cli import parser

    return " ".join(
        parser()._subparsers._group_actions[0].choices[command[0]].format_help().split()
    )


def test_serve_help_says_429_for_one_clients_live_readers():
    text = help_of("serve")
    assert "may hold (0: a tenth of --max-live-readers; more: 429)" in text


def test_rotate_webhook_key_takes_only_its_own_flags():
    text = help_of("rotate-webhook-key")
    assert "--data-dir" in text and "--webhook-key-replay-window" in text
    assert "--port" not in text and "--retention" not in text


# --- One declaration, and what is derived from it --------------------------------------------


def test_the_readmes_settings_table_is_the_generated_one():
    from stream_server.config.table import markdown, table_in

    table = table_in((ROOT / "README.md").read_text())
    assert table == markdown(), "run: durable-streams-server settings --write README.md"
    for group in ("Retention", "Replication", "Subscriptions", "Logs and metrics", "Storage"):
        assert f"**{group}" in table
    for name in env_names():
        assert f"`{name}`" in table


def test_every_setting_is_declared_once_with_its_group_help_and_checks():
    from stream_server.config import described

    for d in described():
        assert d.about.help and d.about.group, d.name
        # The fence file may be missing (not fenced): the one file setting without a check.
        if (d.name.endswith("_file") and d.name != "fence_file") or d.name in (
            "tls_cert",
            "tls_key",
        ):
            assert d.about.checks, f"{d.name}: a file setting without a check"
        if isinstance(d.default, float | int) and not isinstance(d.default, bool):
            assert d.about.checks, f"{d.name}: a number without a range"


# Classes that still restate a group: uvicorn's protocol class (``protocol_class`` binds
# the limits as class attributes, with the connection cap it derives).
STILL_NARROWED = {"LimitedHttpToolsProtocol"}


def _group_classes() -> list[type]:
    from stream_server.declared import groups, network

    found = [*vars(groups).values(), *vars(network).values()]
    return [c for c in found if isinstance(c, type) and dataclasses.is_dataclass(c)]


def test_every_group_is_part_of_the_settings_and_restated_nowhere():
    """A part receives its group itself: no class of the server copies its fields (a
    copy is how a setting's default or check came to differ from its declaration)."""
    import ast

    for group in _group_classes():
        assert issubclass(Settings, group), group
    names = {g.__name__: {f.name for f in dataclasses.fields(g)} for g in _group_classes()}
    server = ROOT / "server" / "stream_server"
    for path in server.rglob("*.py"):
        if path.parent.name in ("declared", "config"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            mine = {
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            if node.name in STILL_NARROWED:
                continue
            for group, fields in names.items():
                # Two names may meet by chance (a URL's host and port): three do not.
                assert len(mine & fields) < 3, f"{path}: {node.name} restates {group}"


def test_the_engine_takes_the_checkpoint_settings(tmp_path):
    from testkit.asgi import build_app

    app = build_app(tmp_path / "d", "--checkpoint-frames", "7", "--checkpoint-interval", "8.5")
    engine = app.store.engine
    assert (engine.checkpoint_frames, engine.checkpoint_seconds) == (7, 8.5)


# --- The docs that state what the code decides -----------------------------------------------


def test_retention_doc_states_the_wals_share_of_the_disk():
    from stream_server.engine.engine import CHECKPOINT_BYTES

    text = " ".join((ROOT / "docs" / "retention.md").read_text().split())
    assert f"up to {CHECKPOINT_BYTES >> 20} MiB of WAL beyond the policies' bounds" in text
    assert "## Not done yet" not in text  # what it listed is done (CRD field, panels, standbys)


def test_replication_doc_names_the_extras_the_laptop_set_needs():
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    text = (ROOT / "docs" / "replication.md").read_text()
    laptop = text[text.index("## Trying it on a laptop") :]
    named = re.search(r"pip install -e '\.\[([a-z,]+)\]'", laptop)
    assert named is not None, "the laptop section says what to install"
    wanted = set(named.group(1).split(","))
    assert {"server", "operator", "dev"} <= wanted <= set(extras)
