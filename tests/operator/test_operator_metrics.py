"""Issue 15, finding 10: the operator's own metrics, and the PodMonitors it makes.

The metrics are read over HTTP from the operator's metrics server while the
real kopf operator reconciles against the emulated API server: one object
that applies, one that the API server refuses (a PodMonitor CRD whose
schema rejects what the operator renders), then a deletion.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from stream_operator import KIND
from stream_operator.controllers import operator_metrics
from stream_operator.specs.render import desired_objects
from testkit import free_port, wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import CRD_FILE, durable_stream, openapi_as_jsonschema
from testkit.operator import running_operator
from testkit.pod_objects import claim_volumes, statefulset_status

pytestmark = pytest.mark.slow

NS = "default"
UID = "uid-1"


@pytest.fixture
def scrape() -> Iterator[Any]:
    """The operator's /metrics, served as ``durable-streams-operator`` serves it."""
    port = free_port()
    server = operator_metrics.serve("127.0.0.1", port, lambda: True)

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    try:
        yield samples
    finally:
        server.shutdown()
        server.server_close()


def value(samples: dict, metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


P = "durable_streams_operator_"


def status_of(c: Cluster, name: str) -> dict[str, Any]:
    return (c.get(KIND, NS, name) or {}).get("status") or {}


def test_reconciles_timestamps_and_conditions_from_a_real_run(scrape):
    before = scrape()
    with cluster() as c:
        # A PodMonitor CRD whose schema refuses what the operator renders (422).
        strict = {
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {"jobLabel": {"type": "integer"}}}
            },
        }
        c.install_podmonitor_crd(strict)
        with running_operator(c):
            c.create(durable_stream("good")).raise_for_status()
            sts = wait_for(lambda: c.get("StatefulSet", NS, "good"), message="StatefulSet")
            claim_volumes(c, sts)
            status = statefulset_status(sts, 1, 1, 1, "r1", "r1")
            c.patch("StatefulSet", NS, "good", {"status": status}, status=True)
            wait_for(lambda: status_of(c, "good").get("phase") == "Ready", message="Ready")
            bad = {"metrics": {"podMonitor": {"enabled": True}}}
            c.create(durable_stream("bad", bad)).raise_for_status()
            wait_for(
                lambda: any(
                    x.get("reason") == "ApplyFailed"
                    for x in status_of(c, "bad").get("conditions") or []
                ),
                message="ApplyFailed",
            )

            def counted() -> dict:
                now = scrape()
                ok = value(now, P + "objects", condition="Accepted", status="False") == 1
                return (
                    ok and value(now, P + "objects", condition="Ready", status="True") == 1 and now
                )

            now = wait_for(counted, message="the conditions counted")
            for outcome in ("applied", "failed"):
                key = P + "reconciles_total"
                grew = value(now, key, outcome=outcome) - value(before, key, outcome=outcome)
                assert grew >= 1, outcome
            assert value(now, P + "reconciles_total", outcome="refused") is not None  # at 0
            count = P + "reconcile_duration_seconds_count"
            assert value(now, count) - value(before, count) >= 2
            stamp = P + "last_successful_reconcile_timestamp_seconds"
            assert value(now, stamp, namespace=NS, name="good") > 0
            assert value(now, stamp, namespace=NS, name="bad") is None  # never applied
            # A deleted DurableStream leaves no series behind.
            c.delete(KIND, NS, "good").raise_for_status()
            wait_for(
                lambda: value(scrape(), stamp, namespace=NS, name="good") is None,
                message="the deleted object's timestamp gone",
            )
            after = scrape()
            assert value(after, P + "objects", condition="Ready", status="True") == 0


def test_replica_sets_failing_over_are_counted(scrape):
    """Issue 25: the objects metric counted every condition but a replica set's
    FailingOver, the one an alert on a failover that does not finish needs."""
    key = P + "objects"
    before = scrape()
    assert value(before, key, condition="FailingOver", status="Unknown") is not None
    lost = {"type": "FailingOver", "status": "True", "reason": "PrimaryLost"}
    operator_metrics.CONDITION_COUNTS.observe("failing", "events", [lost])
    operator_metrics.CONDITION_COUNTS.observe("failing", "orders", [{**lost, "status": "False"}])
    try:
        now = scrape()
        for status in ("True", "False"):
            grew = value(now, key, condition="FailingOver", status=status) - value(
                before, key, condition="FailingOver", status=status
            )
            assert grew == 1, status
    finally:
        operator_metrics.forget("failing", "events")
        operator_metrics.forget("failing", "orders")


def test_a_round_that_read_an_object_before_it_went_does_not_count_it_again(scrape):
    """The watch reports the deletion (the series go) while a round that read the object
    before is still running: its status write came after and counted the object again
    (seen once under load in test_reconciles_timestamps_and_conditions_from_a_real_run)."""
    key = P + "objects"
    ready = [{"type": "Ready", "status": "True", "reason": "AllReplicasReady"}]
    before = value(scrape(), key, condition="Ready", status="True")
    operator_metrics.CONDITION_COUNTS.observe("late", "events", ready)
    operator_metrics.forget("late", "events")  # the watch: DELETED
    operator_metrics.CONDITION_COUNTS.observe("late", "events", ready)  # the round's late write
    operator_metrics.record_reconcile("late", "events", "Applied", 0.1, 1.0)
    now = scrape()
    assert value(now, key, condition="Ready", status="True") == before
    stamp = P + "last_successful_reconcile_timestamp_seconds"
    assert value(now, stamp, namespace="late", name="events") is None
    # One of the same name made again is counted as soon as the watch reports it.
    operator_metrics.seen("late", "events")
    operator_metrics.CONDITION_COUNTS.observe("late", "events", ready)
    try:
        assert value(scrape(), key, condition="Ready", status="True") == (before or 0) + 1
    finally:
        operator_metrics.forget("late", "events")


def test_healthz_asks_the_callback():
    port = free_port()
    healthy = [True]
    server = operator_metrics.serve("127.0.0.1", port, lambda: healthy[0])
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        healthy[0] = False
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 503
    finally:
        server.shutdown()
        server.server_close()


def podmonitor(spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The PodMonitor ``spec.metrics.podMonitor`` renders."""
    objs = desired_objects("ev", "ns", UID, spec, podmonitor_crd=True, **extra)
    return next(o for o in objs if o["kind"] == "PodMonitor")


def crd_validates(spec: dict[str, Any]) -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    schema = openapi_as_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    obj = {"apiVersion": "streams.pyds.dev/v1alpha1", "kind": KIND, "metadata": {"name": "ev"}}
    jsonschema.validate({**obj, "spec": spec}, schema)


def test_podmonitor_labels_from_the_operator_and_the_spec():
    spec = {"metrics": {"podMonitor": {"enabled": True, "labels": {"team": "streams"}}}}
    crd_validates(spec)
    pm = podmonitor(spec, monitor_labels={"release": "prom", "team": "ops"})
    labels = pm["metadata"]["labels"]
    assert labels["release"] == "prom" and labels["team"] == "streams"  # the spec wins
    assert labels["app.kubernetes.io/managed-by"] == "durable-streams-operator"
    # The labels the operator prunes by cannot be overridden.
    spec["metrics"]["podMonitor"]["labels"] = {"app.kubernetes.io/instance": "x"}
    assert podmonitor(spec)["metadata"]["labels"]["app.kubernetes.io/instance"] == "ev"


def test_podmonitor_checks_the_servers_certificate():
    """Before: ``insecureSkipVerify: true`` whenever the server spoke TLS."""
    tls = {"server": {"tlsSecretName": "ev-tls"}}
    pm = podmonitor({**tls, "metrics": {"podMonitor": {"enabled": True}}})
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "ev-tls", "key": "ca.crt"}},
        "serverName": "ev.ns.svc",
    }
    own = {
        "ca": {"configMap": {"name": "root-ca", "key": "ca.pem"}},
        "serverName": "streams.example",
    }
    spec = {**tls, "metrics": {"podMonitor": {"enabled": True, "tlsConfig": own}}}
    crd_validates(spec)
    assert podmonitor(spec)["spec"]["podMetricsEndpoints"][0]["tlsConfig"] == own
    insecure = {"enabled": True, "tlsConfig": {"insecureSkipVerify": True}}
    spec = {**tls, "metrics": {"podMonitor": insecure}}
    crd_validates(spec)
    assert podmonitor(spec)["spec"]["podMetricsEndpoints"][0]["tlsConfig"] == {
        "insecureSkipVerify": True
    }
    # Plain HTTP: no tlsConfig at all.
    plain = podmonitor({"metrics": {"podMonitor": {"enabled": True}}})
    assert "tlsConfig" not in plain["spec"]["podMetricsEndpoints"][0]
    # One CA source, not two.
    both = {
        "secret": {"name": "a", "key": "ca.crt"},
        "configMap": {"name": "b", "key": "ca.crt"},
    }
    with pytest.raises(jsonschema.ValidationError):
        crd_validates({"metrics": {"podMonitor": {"tlsConfig": {"ca": both}}}})
