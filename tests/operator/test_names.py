"""Issue 42: names that cannot be rendered are refused, by the CRD and by the operator.

A name of 53 characters or more made a StatefulSet whose pods' revision label cannot
hold it (``<name>-<10-character hash>`` in 63), and a name with a dot made Services the
API server refuses (DNS-1035 labels): the operator applied half a DurableStream. Now the
CRD's root rules refuse them at the door, and the operator, on clusters that did not
run those rules, renders nothing and says why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from stream_operator import KIND
from stream_operator.api import names
from stream_operator.controllers import reconcile
from stream_operator.controllers.periodic import Periodic
from stream_operator.kube import events
from stream_operator.specs.render import desired_objects
from testkit import crd_schema
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream

CRD = Path(__file__).resolve().parents[2] / "charts/durable-streams/files/crds/durablestreams.yaml"
LONGEST = "a" * names.MAX_LENGTH
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_the_longest_name_fits_everything_rendered_from_it():
    """The limit is the real one: at 52 characters every rendered name and label fits,
    the StatefulSet's revision label (``<name>-<10-character hash>``) with no room left."""
    assert len(LONGEST) + len("-") + 10 == 63
    objs = desired_objects(LONGEST, "ns", "uid", {"replicas": 3})
    for obj in objs:
        meta = obj["metadata"]
        assert len(meta["name"]) <= 253
        if obj["kind"] == "Service":
            assert DNS_1035.match(meta["name"]) and len(meta["name"]) <= 63, meta["name"]
        for value in (meta.get("labels") or {}).values():
            assert len(value) <= 63
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    assert len(f"{sts['metadata']['name']}-{sts['spec']['replicas'] - 1}") <= 63  # a host name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (LONGEST, None),
        ("events", None),
        ("e", None),
        ("a" * (names.MAX_LENGTH + 1), "53 characters: at most 52"),
        ("events.eu", "not a DNS-1035 label"),
        ("1events", "not a DNS-1035 label"),
    ],
)
def test_the_operator_refuses_what_cannot_be_rendered(name: str, why: str | None):
    refused = names.refused(name)
    assert (refused is None) if why is None else (why in (refused or ""))


def test_the_crd_refuses_the_same_names():
    """The CRD's root rules are the operator's limits (a root rule may read metadata.name),
    written by the code that checks."""
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["x-kubernetes-validations"] == names.crd_rules()
    rule = names.crd_rules()[1]["rule"]
    pattern = rule.split("matches('", 1)[1].rsplit("')", 1)[0]
    assert pattern == names.PATTERN and pattern == DNS_1035.pattern


@pytest.mark.parametrize(
    "name", [LONGEST, "events", "e", "a" * (names.MAX_LENGTH + 1), "events.eu", "1events", "Ev"]
)
def test_the_crds_rules_evaluated_refuse_what_the_operator_refuses(name: str):
    """The root rules run (CEL, as kube-apiserver runs them: testkit.crd_schema) on a
    DurableStream of each name: refused exactly where ``names.refused`` refuses, with the
    rule's message at the root (``<nil>`` in the API server's words)."""
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    errors = crd_schema.validate(schema, durable_stream(name, {}))
    assert all(e.field == "<nil>" and e.detail.startswith("metadata.name: ") for e in errors)
    assert bool(errors) == (names.refused(name) is not None), (name, errors)


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


@pytest.mark.parametrize("name", ["a" * (names.MAX_LENGTH + 1), "events.eu"])
def test_a_name_the_crd_did_not_check_renders_nothing_and_is_reported(
    kube: Cluster, name: str, monkeypatch: pytest.MonkeyPatch
):
    warnings: list[dict[str, Any]] = []
    monkeypatch.setattr(events, "warn", lambda body, **kw: warnings.append(kw))
    assert kube.create(durable_stream(name, {"replicas": 3})).status_code == 422  # the rules
    kube.serve_crd_without_rules()  # a cluster whose CRD predates them
    kube.create(durable_stream(name, {"replicas": 3})).raise_for_status()
    ac = client.ApiClient(client.Configuration(host=kube.url))
    reconcile.converge(ac, name, "default", logging.getLogger("test"), Periodic(lambda *_: None))
    status = kube.get(KIND, "default", name)["status"]
    accepted = next(c for c in status["conditions"] if c["type"] == "Accepted")
    assert accepted["status"] == "False" and accepted["reason"] == names.INVALID
    assert warnings and warnings[0]["reason"] == names.INVALID
    assert warnings[0]["message"] == accepted["message"]
    operator = [c for c in kube.api.requests if not c.agent.startswith("python-httpx/")]
    writes = {c.resource for c in operator if c.verb in ("create", "patch", "update")}
    assert writes == {"durablestreams/status"}  # the status alone
    for kind in ("StatefulSet", "Service", "ConfigMap", "Secret"):
        assert kube.list(kind, "default") == [], kind
