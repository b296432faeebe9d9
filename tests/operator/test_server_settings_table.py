"""The operator's table of server settings (``stream_operator.api.server_settings``) against
the server's own declaration: every declared setting is reachable from the spec (the
``server.settings`` map, a typed field, or the operator's own value), and the map
accepts and refuses exactly what the server's parser and checks do.

The operator may not import the server, so this test is the one place both are seen.
"""

from __future__ import annotations

from typing import Any

import pytest

from stream_operator.api import server_settings
from stream_operator.api.server_settings import FREE, OWNED, SPEC_FIELDS, refused_settings
from stream_operator.api.spec import refused_change
from stream_operator.specs.render import render_configmap
from stream_server.config import checks
from stream_server.config.declaration import described
from stream_server.config.flags import SettingError, parse_value
from stream_server.declared.about import Described

DECLARED = {d.flag.removeprefix("--"): d for d in described()}
# Checks that look at the machine the server runs on (CPUs, open-file limit): the pod's,
# which the operator cannot see.
HOST_CHECKS = {checks.workers_here, checks.connections_here}


def server_refuses(d: Described, text: str) -> bool:
    """Whether the server would refuse ``text`` for ``d`` at start: its parser, then
    each of its checks on that one value."""
    try:
        value = parse_value(d, text)
    except SettingError:
        return True
    return any(check(value) is not None for check in d.about.checks if check not in HOST_CHECKS)


def probes(kind: server_settings.Kind) -> list[str]:
    """Values at and past the table's bounds, and some that are not numbers at all."""
    edges = [kind.low, kind.high]
    numbers = {e + step for e in edges for step in (-1, 0, 1) if abs(e) < 2**60}
    numbers |= {0, 1, -1, 2**63, 2**63 - 1}
    texts = {str(int(n)) for n in numbers}
    texts |= {"0.5", "-0.5", "1e400", "nan", "inf", "abc", "", "true", "off", "YES", "1.0"}
    return sorted(texts)


def test_every_declared_setting_is_reachable_exactly_once():
    free, spec, owned = set(FREE), set(SPEC_FIELDS), set(OWNED)
    assert not (free & spec or free & owned or spec & owned)
    assert free | spec | owned == set(DECLARED), (
        f"not in the operator's table: {sorted(set(DECLARED) - free - spec - owned)}; "
        f"in it but not declared: {sorted(free | spec | owned - set(DECLARED))}"
    )
    # Reachable from the spec: all but the peers' client certificate and key (mutual TLS
    # between replicas), files no spec field mounts yet.
    unreachable = {k for k, why in OWNED.items() if "no spec field" in why}
    assert unreachable == {"replication-cert-file", "replication-key-file"}


@pytest.mark.parametrize("flag", sorted(FREE))
def test_the_table_refuses_what_the_server_refuses(flag):
    d, kind = DECLARED[flag], FREE[flag]
    assert kind.type is type(d.default), f"{flag}: the server's default is {d.default!r}"
    assert not d.is_list
    for text in probes(kind):
        ours = kind.refused(text) is not None
        assert ours == server_refuses(d, text), f"{flag}={text!r}: operator refuses: {ours}"


def test_settings_reach_the_servers_environment_by_their_variable():
    settings = {"max-streams": 1000, "keep-alive-timeout": "75", "metrics": False}
    data = render_configmap("events", "default", "uid", {"server": {"settings": settings}})["data"]
    assert data["DS_MAX_STREAMS"] == "1000"
    assert data["DS_KEEP_ALIVE_TIMEOUT"] == "75"
    assert data["DS_METRICS"] == "false"
    for flag in settings:
        assert server_settings.env_name(flag) == DECLARED[flag].env


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"long-poll-timeout": 5}, "spec.server.longPollTimeoutSeconds"),
        ({"data-dir": "/x"}, "the operator sets it (the volume's mount)"),
        ({"max-stream": 5}, "not a server setting"),
        ({"--max-streams": 5}, "without the leading --"),
        ({"max-streams": -1}, "server.settings.max-streams must be 0 to"),
        ({"keep-alive-timeout": "soon"}, "must be a number"),
        ({"metrics": "maybe"}, "must be true or false"),
        ({"hot-streams": {"a": 1}}, "give one value"),
    ],
)
def test_a_setting_the_server_would_refuse_is_refused_with_what_to_do(settings, said):
    problem = refused_settings(settings)
    assert problem is not None and said in problem
    spec: dict[str, Any] = {"server": {"settings": settings}}
    assert refused_change(None, spec) == problem


def test_settings_change_the_config_hash():
    from stream_operator.specs.render import config_hash

    assert config_hash({}) != config_hash({"server": {"settings": {"max-streams": 10}}})


def test_the_webhook_ca_is_a_secrets_key_mounted_for_the_server():
    """--webhook-ca-file, reachable through server.subscriptions.webhookCA: a receiver
    with a private CA's certificate (cert-manager's) failed every TLS handshake."""
    from stream_operator.specs.render import render_statefulset

    spec = {"server": {"subscriptions": {"webhookCA": {"name": "hooks-ca", "key": "ca.pem"}}}}
    data = render_configmap("events", "default", "uid", spec)["data"]
    assert data[DECLARED["webhook-ca-file"].env] == "/etc/durable-streams/webhook-ca/ca.crt"
    pod = render_statefulset("events", "default", "uid", spec)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-ca")
    assert volume["secret"] == {
        "secretName": "hooks-ca",
        "items": [{"key": "ca.pem", "path": "ca.crt"}],
    }
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "webhook-ca")
    assert mount == {
        "name": "webhook-ca",
        "mountPath": "/etc/durable-streams/webhook-ca",
        "readOnly": True,
    }
    assert "DS_WEBHOOK_CA_FILE" not in render_configmap("events", "default", "uid", {})["data"]


def test_the_crd_takes_the_webhook_ca_as_a_secrets_key():
    from pathlib import Path

    import jsonschema
    import yaml

    from testkit.kube import openapi_as_jsonschema

    crd = (
        Path(__file__).resolve().parents[2]
        / "charts/durable-streams/files/crds/durablestreams.yaml"
    )
    schema = openapi_as_jsonschema(
        yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    )

    def cr(ca: Any) -> dict[str, Any]:
        spec = {"server": {"subscriptions": {"webhookCA": ca}}}
        return {"apiVersion": "streams.pyds.dev/v1alpha1", "kind": "DurableStream", "spec": spec}

    jsonschema.validate(cr({"name": "hooks-ca", "key": "ca.crt"}), schema)
    for bad in ({"name": "hooks-ca"}, {"name": "", "key": "ca.crt"}, "hooks-ca"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(cr(bad), schema)
