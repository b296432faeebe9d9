"""``operator.tuning`` in the chart: the operator's timings, with the operator's own
defaults, rendered into its Deployment and refused by the schema where the operator would
refuse them (rendered by real helm)."""

from __future__ import annotations

import dataclasses

import pytest

from stream_operator.configuration.operator_settings import PARSED, OperatorSettings, parse
from testkit.helm_chart import helm_binary, helm_template, operator_env

pytestmark = pytest.mark.processes  # helm

TUNING = {
    "apiTimeoutSeconds": "DS_OPERATOR_API_TIMEOUT",
    "statusIntervalSeconds": "DS_OPERATOR_STATUS_INTERVAL",
    "resyncIntervalSeconds": "DS_OPERATOR_RESYNC_INTERVAL",
    "periodicWorkers": "DS_OPERATOR_PERIODIC_WORKERS",
    "stallSeconds": "DS_OPERATOR_STALL_SECONDS",
    "peerTokenRotationSeconds": "DS_OPERATOR_PEER_TOKEN_ROTATION",
}


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def _tuning(settings: OperatorSettings) -> dict[str, object]:
    fields = {name: PARSED[name][0] for name in TUNING.values()}
    return {name: getattr(settings, attr) for name, attr in fields.items()}


def test_the_charts_defaults_are_the_operators(helm: str):
    """Every tuning variable is rendered, and read back as the operator's defaults: a
    default changed on one side only would fail here."""
    env = operator_env(helm)
    given = {name: env[name] for name in TUNING.values()}
    assert _tuning(parse(given)) == _tuning(OperatorSettings())


def test_each_value_reaches_the_operator(helm: str):
    values = {
        "apiTimeoutSeconds": "2.5",
        "statusIntervalSeconds": "1",
        "resyncIntervalSeconds": "30",
        "periodicWorkers": "8",
        "stallSeconds": "120",
        "peerTokenRotationSeconds": "86400",
    }
    env = operator_env(helm, *(f"operator.tuning.{k}={v}" for k, v in values.items()))
    assert {TUNING[k]: env[TUNING[k]] for k in values} == {TUNING[k]: v for k, v in values.items()}
    s = parse({TUNING[k]: env[TUNING[k]] for k in values})
    want = dataclasses.replace(
        OperatorSettings(),
        api_timeout=2.5,
        status_interval=1.0,
        resync_interval=30.0,
        periodic_workers=8,
        stall_seconds=120.0,
        peer_token_rotation=86400.0,
    )
    assert s == want


@pytest.mark.parametrize(
    "bad",
    [
        "operator.tuning.apiTimeoutSeconds=0",
        "operator.tuning.statusIntervalSeconds=-1",
        "operator.tuning.resyncIntervalSeconds=0",
        "operator.tuning.periodicWorkers=0",
        "operator.tuning.periodicWorkers=1.5",
        "operator.tuning.stallSeconds=0",
        "operator.tuning.stallSecond=60",
    ],
)
def test_the_schema_refuses_what_the_operator_would(helm: str, bad: str):
    proc = helm_template(helm, bad)
    assert proc.returncode != 0 and bad.split("=")[0].split(".")[-1] in proc.stderr
