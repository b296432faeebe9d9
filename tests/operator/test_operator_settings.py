"""The operator's own settings (``DS_OPERATOR_*``): checked once, at start, each bad value
refused with one line naming the variable and the value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stream_operator.configuration.operator_settings import OperatorSettings, SettingError, parse

pytestmark = pytest.mark.processes  # one test starts the operator's command


def test_the_defaults_and_given_values():
    assert parse({}) == OperatorSettings()
    s = parse(
        {
            "DS_OPERATOR_API_TIMEOUT": "2.5",
            "DS_OPERATOR_STATUS_INTERVAL": "1",
            "DS_OPERATOR_RESYNC_INTERVAL": "30",
            "DS_OPERATOR_PERIODIC_WORKERS": "8",
            "DS_OPERATOR_STALL_SECONDS": "120",
            "DS_OPERATOR_METRICS_PORT": "0",
            "DS_OPERATOR_LEADER_ELECTION": "False",
            "DS_OPERATOR_UNPINNED_SERVER_IMAGE": "hold",
            "DS_OPERATOR_PODMONITOR_LABELS": '{"release": "prometheus"}',
            "DS_OPERATOR_SERVER_IMAGE": "anything:1",
            "PATH": "/usr/bin",
        }
    )
    assert (s.api_timeout, s.status_interval, s.resync_interval) == (2.5, 1.0, 30.0)
    assert (s.periodic_workers, s.stall_seconds, s.metrics_port) == (8, 120.0, 0)
    assert (s.leader_election, s.unpinned_server_image) == (False, "hold")
    assert s.monitor_labels == {"release": "prometheus"}
    # The older name of the labels is gone with the ServiceMonitor alias: refused.
    with pytest.raises(SettingError, match="unknown setting DS_OPERATOR_SERVICEMONITOR_LABELS"):
        parse({"DS_OPERATOR_SERVICEMONITOR_LABELS": '{"a": "b"}'})
    assert parse({"DS_OPERATOR_PODMONITOR_LABELS": ""}).monitor_labels == {}


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("DS_OPERATOR_STALL_SECONDS", "0", "positive number of seconds"),
        ("DS_OPERATOR_STATUS_INTERVAL", "-1", "positive number of seconds"),
        ("DS_OPERATOR_API_TIMEOUT", "ten", "positive number of seconds"),
        ("DS_OPERATOR_RESYNC_INTERVAL", "nan", "positive number of seconds"),
        ("DS_OPERATOR_PERIODIC_WORKERS", "0", "at least 1"),
        ("DS_OPERATOR_PERIODIC_WORKERS", "2.5", "at least 1"),
        ("DS_OPERATOR_METRICS_PORT", "70000", "port number"),
        ("DS_OPERATOR_LEADER_ELECTION", "yes", "true or false"),
        ("DS_OPERATOR_UNPINNED_SERVER_IMAGE", "later", "roll or hold"),
        ("DS_OPERATOR_PODMONITOR_LABELS", '{"a": 1}', "JSON object of strings"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(name: str, raw: str, says: str):
    with pytest.raises(SettingError) as caught:
        parse({name: raw})
    assert str(caught.value).startswith(f"{name}={raw!r}: ") and says in str(caught.value)


def test_an_unknown_operator_variable_is_refused_with_a_hint():
    with pytest.raises(SettingError, match=r"unknown setting DS_OPERATOR_STALL_SECOND \(did"):
        parse({"DS_OPERATOR_STALL_SECOND": "60"})


def test_the_operator_does_not_start_on_a_bad_value(tmp_path):
    """As a process: exit status 2 and one line on stderr, before it reads a kubeconfig
    or serves anything (the old code: a traceback from an import, or, for some values,
    an operator running with a setting it misread)."""
    env = {
        **os.environ,
        "KUBECONFIG": str(tmp_path / "none"),
        "DS_OPERATOR_PERIODIC_WORKERS": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "stream_operator", "--metrics-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "durable-streams-operator: DS_OPERATOR_PERIODIC_WORKERS='0': must be a whole number "
        "of at least 1"
    ]
