"""The Prometheus alert rules: promtool checks them and runs their unit tests,
and every alert is tested both firing and not firing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from testkit import needs

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "observability" / "prometheus"
DOCS = ROOT / "docs" / "observability.md"
ALERTS = RULES_DIR / "alerts.yaml"
UNIT_TESTS = RULES_DIR / "alerts.test.yaml"

needs_promtool = needs.commands(
    "promtool", install="Debian's prometheus package (make system-deps)"
)


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


@needs_promtool
def test_promtool_check_rules():
    out = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout, out.stdout


@needs_promtool
def test_promtool_unit_tests():
    out = subprocess.run(
        ["promtool", "test", "rules", UNIT_TESTS.name],
        cwd=RULES_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout, out.stdout


def test_the_alerts_asked_for_with_severity_and_runbook():
    by_name = {r["alert"]: r for r in rules()}
    assert by_name.keys() == {
        "DurableStreamsStorageFailedClosed",
        "DurableStreamsNotReady",
        "DurableStreamsRecoveryInterrupted",
        "DurableStreamsTargetDown",
        "DurableStreamsFsyncSlow",
        "DurableStreamsAppendSlow",
        "DurableStreamsErrorRate",
        "DurableStreamsDiskNearlyFull",
        "DurableStreamsInodesNearlyFull",
        "DurableStreamsBatchFailures",
        "DurableStreamsWebhookDeliveriesFailing",
        "DurableStreamsReplicationLagHigh",
        "DurableStreamsTooFewInSync",
        "DurableStreamReconcileFailing",
        "DurableStreamsArchiveFailing",
        "DurableStreamsArchiveLagging",
        "DurableStreamsLastBackupTooOld",
        "DurableStreamsReplicaClusterStuck",
    }
    for name, rule in by_name.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"], name
        assert "Runbook:" in rule["annotations"]["description"], name
    assert by_name["DurableStreamsStorageFailedClosed"]["labels"]["severity"] == "critical"
    assert "for" not in by_name["DurableStreamsStorageFailedClosed"]  # at once
    assert "durable_streams_ready == 0" in by_name["DurableStreamsNotReady"]["expr"]


def test_every_alert_is_unit_tested_firing_and_not_firing():
    cases = [
        case
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    for rule in rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']} never tested firing"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']} never tested quiet"


def test_docs_explain_every_alert():
    docs = DOCS.read_text()
    for rule in rules():
        assert f"| {rule['alert']} | {rule['labels']['severity']} |" in docs, rule["alert"]
