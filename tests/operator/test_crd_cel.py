"""Every CEL rule (``x-kubernetes-validations``) of both CRDs, evaluated as kube-apiserver
evaluates it (testkit.crd_schema, testkit.crd_cel on cel-python), on an object it lets
through and one it refuses.

The rules are found in the CRD files, not listed here: a rule added without a case in
``CASES`` fails ``test_every_rule_has_a_case``. A transition rule (one that reads
``oldSelf``) is checked on an update, from the case's stored object; the others on a
create. Where the chart's rules use Kubernetes' CEL library (``quantity()``), the
library's functions are checked against the documented results
(https://kubernetes.io/docs/reference/using-api/cel/#kubernetes-quantity-library).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from testkit import crd_cel, crd_schema
from testkit.cluster import Cluster, cluster
from testkit.kube import BACKUP_CRD_FILE, CRD_FILE, durable_stream

NS = "default"


class Rule(NamedTuple):
    crd: Path
    path: str  # where in the schema, e.g. spec.storage
    rule: dict[str, Any]


class Case(NamedTuple):
    """A rule's two objects: ``good`` passes it, ``bad`` is refused at ``field``. With
    ``stored``, both are updates of that object (a transition rule's ``oldSelf``)."""

    good: dict[str, Any]
    bad: dict[str, Any]
    field: str
    stored: dict[str, Any] | None = None


def schema_of(crd: Path) -> dict[str, Any]:
    doc = yaml.safe_load(crd.read_text())
    version = next(v for v in doc["spec"]["versions"] if v.get("storage"))
    return version["schema"]["openAPIV3Schema"]


def rules_in(crd: Path) -> Iterator[Rule]:
    def walk(schema: dict[str, Any], path: str) -> Iterator[Rule]:
        for rule in schema.get("x-kubernetes-validations") or ():
            yield Rule(crd, path or "<root>", rule)
        for name, sub in (schema.get("properties") or {}).items():
            yield from walk(sub, f"{path}.{name}" if path else name)
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                yield from walk(schema[key], f"{path}[*]")

    yield from walk(schema_of(crd), "")


RULES = [*rules_in(CRD_FILE), *rules_in(BACKUP_CRD_FILE)]


def ds(spec: dict[str, Any] | None = None, name: str = "x") -> dict[str, Any]:
    return durable_stream(name, spec or {}, NS)


def backup(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "streams.pyds.dev/v1alpha1",
        "kind": "DurableStreamBackup",
        "metadata": {"name": "b", "namespace": NS},
        "spec": spec,
    }


SOURCE = {"destinationPath": "s3://bucket/set-a"}
RECOVERY = {"recovery": {"source": SOURCE}}

# By the rule's message (unique in each CRD).
CASES: dict[str, Case] = {
    "metadata.name: at most 52 characters (the StatefulSet's pods carry <name>-<10-character "
    "revision hash> in a 63-character label)": Case(ds(name="a" * 52), ds(name="a" * 53), "<nil>"),
    "metadata.name: a DNS-1035 label (lower-case letters, digits and '-', a letter first, no "
    "dots): the Services are named after it": Case(
        ds(name="events-1"), ds(name="9events"), "<nil>"
    ),
    "renewDeadlineSeconds must be less than leaseDurationSeconds": Case(
        ds({"replication": {"leaseDurationSeconds": 15, "renewDeadlineSeconds": 10}}),
        ds({"replication": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}}),
        "spec.replication",
    ),
    "retryPeriodSeconds must be less than renewDeadlineSeconds": Case(
        ds({"replication": {"renewDeadlineSeconds": 5, "retryPeriodSeconds": 4}}),
        ds({"replication": {"renewDeadlineSeconds": 5, "retryPeriodSeconds": 5}}),
        "spec.replication",
    ),
    "storageClassName cannot change": Case(
        ds({"storage": {"storageClassName": "fast", "size": "20Gi"}}),
        ds({"storage": {"storageClassName": "slow"}}),
        "spec.storage.storageClassName",
        stored=ds({"storage": {"storageClassName": "fast"}}),
    ),
    "storage size can only grow": Case(
        ds({"storage": {"size": "10240Mi"}}),  # the same quantity, written otherwise
        ds({"storage": {"size": "9Gi"}}),
        "spec.storage.size",
        stored=ds({"storage": {"size": "10Gi"}}),
    ),
    "server.settings: a name that is not a server setting, or one a field of this spec sets "
    "or the operator owns (docs/kubernetes.md, Server settings)": Case(
        ds({"server": {"settings": {"max-streams": 100000, "keep-alive-timeout": 75}}}),
        ds({"server": {"settings": {"max-streams": 100000, "port": 80}}}),
        "spec.server.settings",
    ),
    "a retention entry needs maxBytes, maxAge or both": Case(
        ds({"server": {"retention": [{"prefix": "logs/", "maxAge": "7d"}]}}),
        ds({"server": {"retention": [{"prefix": "", "maxAge": "7d"}, {"prefix": "logs/"}]}}),
        "spec.server.retention[1]",
    ),
    "give targetTime or targetLSN, not both": Case(
        ds({"bootstrap": {"recovery": {"source": SOURCE, "recoveryTarget": {"targetLSN": 9}}}}),
        ds(
            {
                "bootstrap": {
                    "recovery": {
                        "source": SOURCE,
                        "recoveryTarget": {"targetTime": "2026-01-01T00:00:00Z", "targetLSN": 9},
                    }
                }
            }
        ),
        "spec.bootstrap.recovery.recoveryTarget",
    ),
    "replica.enabled needs replica.source, the archive to follow": Case(
        ds({"replica": {"enabled": True, "source": SOURCE}}),
        ds({"replica": {"enabled": True}}),
        "spec.replica",
    ),
    "server.tlsSecretName and certificates.issuerRef are both set; name the Secret or the "
    "issuer that makes it, not both": Case(
        ds({"certificates": {"issuerRef": {"name": "ca"}}}),
        ds({"certificates": {"issuerRef": {"name": "ca"}}, "server": {"tlsSecretName": "t"}}),
        "spec.certificates.issuerRef",
    ),
    "replication.minInSync cannot exceed replicas (lower minInSync before scaling down)": Case(
        ds({"replicas": 3, "replication": {"minInSync": 3}}),
        ds({"replicas": 2, "replication": {"minInSync": 3}}),
        "spec.replication.minInSync",
    ),
    "bootstrap cannot change after the DurableStream is created": Case(
        ds({"bootstrap": RECOVERY, "replicas": 3}),
        ds({"bootstrap": {"recovery": {"source": SOURCE, "backupID": "b1"}}}),
        "spec.bootstrap",
        stored=ds({"bootstrap": RECOVERY}),
    ),
    "a backup's spec cannot change; create another backup": Case(
        backup({"cluster": "events"}),
        backup({"cluster": "events", "target": "primary"}),
        "spec",
        stored=backup({"cluster": "events"}),
    ),
}


def admitted(crd: Path, obj: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
    """``obj`` created, or (``stored``) an update of ``stored`` as created."""
    schema = schema_of(crd)
    old = None if stored is None else crd_schema.admit(schema, copy.deepcopy(stored))
    if old is not None:
        obj = {**copy.deepcopy(obj), "metadata": old["metadata"]}
    return crd_schema.admit(schema, copy.deepcopy(obj), old)


def test_every_rule_has_a_case():
    messages = [r.rule.get("message") for r in RULES]
    assert len(messages) == len(set(messages)), "two rules share a message"
    missing = [f"{r.crd.name} {r.path}: {r.rule.get('message')!r}" for r in RULES]
    missing = [m for m, r in zip(missing, RULES, strict=True) if r.rule.get("message") not in CASES]
    assert not missing, f"CEL rules without a case in CASES: {missing}"
    assert set(CASES) <= set(messages), set(CASES) - set(messages)  # no case for a gone rule


@pytest.mark.parametrize(
    "rule", RULES, ids=lambda r: f"{r.crd.stem}:{r.path}:{r.rule['rule'][:40]}"
)
def test_the_rule_lets_its_good_case_through_and_refuses_its_bad_one(rule: Rule):
    case = CASES.get(str(rule.rule.get("message")))
    if case is None:
        pytest.fail(f"no case for {rule.rule['rule']!r} (test_every_rule_has_a_case)")
    assert crd_cel.uses_old_self(rule.rule) == (case.stored is not None)
    admitted(rule.crd, case.good, case.stored)
    with pytest.raises(crd_schema.Invalid) as refused:
        admitted(rule.crd, case.bad, case.stored)
    errors = refused.value.errors
    assert [(e.field, e.type, e.detail) for e in errors] == [
        (case.field, "Invalid value", rule.rule["message"])
    ], errors


def test_a_transition_rule_is_not_run_on_a_create():
    """kube-apiserver runs a rule that reads ``oldSelf`` only on an update (where the old
    value exists): a new object with any size or class is created."""
    schema = schema_of(CRD_FILE)
    crd_schema.admit(schema, ds({"storage": {"size": "1Gi", "storageClassName": "slow"}}))


def test_the_422_has_kube_apiservers_message_and_causes():
    """The Status as kube-apiserver writes it for a failed rule: ``<Kind>.<group> "<name>"
    is invalid: <field>: Invalid value: "object": <message>``, the field in the causes."""
    with cluster() as kube:
        r = kube.create(ds({"replicas": 2, "replication": {"minInSync": 3}}, name="cel"))
        assert r.status_code == 422
        body = r.json()
        assert body["reason"] == "Invalid"
        assert body["message"] == (
            'DurableStream.streams.pyds.dev "cel" is invalid: spec.replication.minInSync: '
            'Invalid value: "object": replication.minInSync cannot exceed replicas '
            "(lower minInSync before scaling down)"
        )
        assert body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "object": replication.minInSync cannot exceed '
                "replicas (lower minInSync before scaling down)",
                "field": "spec.replication.minInSync",
            }
        ]
        shrink_through_the_api(kube)


def shrink_through_the_api(kube: Cluster) -> None:
    """A transition rule through the emulator: a patch that shrinks the volume is refused
    with the rule's message at its fieldPath; one that grows it is stored."""
    kube.create(ds({"storage": {"size": "10Gi"}}, name="grow")).raise_for_status()
    r = kube.patch("DurableStream", NS, "grow", {"spec": {"storage": {"size": "1Gi"}}})
    assert r.status_code == 422
    assert r.json()["message"].endswith(
        'spec.storage.size: Invalid value: "object": storage size can only grow'
    )
    kube.patch("DurableStream", NS, "grow", {"spec": {"storage": {"size": "1Ti"}}})
    stored = kube.get("DurableStream", NS, "grow")
    assert stored is not None and stored["spec"]["storage"]["size"] == "1Ti"


# -- the CEL library and the rule fields, on rules of their own ---------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("quantity('1Gi').compareTo(quantity('1024Mi')) == 0", True),
        ("quantity('1Gi').compareTo(quantity('1G')) > 0", True),  # 2^30 > 10^9
        ("quantity('500m').isLessThan(quantity('1'))", True),
        ("quantity('2').isGreaterThan(quantity('1500m'))", True),
        ("quantity('1k').asInteger() == 1000", True),
        ("quantity('1.5').isInteger()", False),
        ("quantity('-3').sign() == -1", True),
        ("quantity('1Gi').add(quantity('1Gi')).compareTo(quantity('2Gi')) == 0", True),
        ("quantity('1Gi').sub(1).asInteger() == 1073741823", True),
        ("isQuantity('10Gi') && !isQuantity('ten')", True),
        ("'abc'.matches('^a') && size('abc') == 3 && 'abc'.size() == 3", True),
    ],
)
def test_the_kubernetes_cel_library(expression: str, expected: bool):
    assert crd_cel.evaluate({"rule": expression}, {}).passed is expected


def test_a_malformed_quantity_is_an_evaluation_error_not_a_pass():
    outcome = crd_cel.evaluate({"rule": "quantity(self.size).asInteger() > 0"}, {"size": "x"})
    assert not outcome.passed and outcome.error
    assert "evaluating rule: quantity(self.size)" in outcome.message


SMALL = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "x-kubernetes-validations": [
                {
                    "rule": "self.a < self.b",
                    "messageExpression": "'a (' + string(self.a) + ') must be below b'",
                    "reason": "FieldValueForbidden",
                    "fieldPath": ".a",
                },
                {"rule": "self.a >= 0", "messageExpression": "''", "message": "a is negative"},
                {"rule": "self.b != 7"},
            ],
        }
    },
}


def test_message_expression_reason_and_field_path():
    """messageExpression's string is the message (an empty one falls back to message,
    then to ``failed rule: <rule>``); reason sets the error type; fieldPath the field."""
    with pytest.raises(crd_schema.Invalid) as refused:
        crd_schema.admit(SMALL, {"spec": {"a": 8, "b": 7}})
    assert [str(e) for e in refused.value.errors] == [
        "spec.a: Forbidden: a (8) must be below b",
        'spec: Invalid value: "object": failed rule: self.b != 7',
    ]
    with pytest.raises(crd_schema.Invalid) as refused:
        crd_schema.admit(SMALL, {"spec": {"a": -2, "b": -1}})
    assert [str(e) for e in refused.value.errors] == [
        'spec: Invalid value: "object": a is negative'
    ]


def test_an_unchanged_value_is_not_checked_again_on_an_update():
    """Validation ratcheting (Kubernetes 1.30+, on by default): an object stored before a
    rule was added is still updated where the update leaves the failing value alone."""
    stored = {"spec": {"a": 5, "b": 1}, "status": {}}  # stored under a CRD without the rules
    crd_schema.admit(SMALL, {**copy.deepcopy(stored), "status": {"x": 1}}, stored)
    with pytest.raises(crd_schema.Invalid):
        crd_schema.admit(SMALL, {"spec": {"a": 6, "b": 1}}, stored)
