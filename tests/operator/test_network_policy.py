"""Issue 42: each DurableStream's NetworkPolicy (network_policy.py), rendered: what it
lets in and out, and how it is turned off; and the chart's for the operator's pod."""

from __future__ import annotations

from typing import Any

import pytest

from stream_operator.configuration import operator_settings
from stream_operator.specs.render import CONTAINER_PORT, desired_objects, selector
from testkit.helm_chart import helm_binary, rendered

UID = "uid-1"
STORE = {"objectStore": {"destinationPath": "s3://b/p", "endpointURL": "http://minio.store:9000"}}


def policy(spec: dict[str, Any]) -> dict[str, Any]:
    (obj,) = [o for o in desired_objects("ev", "ns", UID, spec) if o["kind"] == "NetworkPolicy"]
    return obj["spec"]


def ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p["protocol"], p["port"]) for p in rule.get("ports") or []}


def test_a_replica_set_takes_anyone_on_its_port_only_by_default() -> None:
    """Clients in other namespaces (and ingress controllers) keep reaching the server
    when an operator upgrade brings the policy; only the port is narrowed."""
    spec = policy({"replicas": 3})
    assert spec["podSelector"] == {"matchLabels": selector("ev")}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"ports": [{"protocol": "TCP", "port": CONTAINER_PORT}]}]


def test_named_clients_narrow_it_to_them_peers_the_operator_and_scrapes() -> None:
    team = {"namespaceSelector": {"matchLabels": {"team": "a"}}}
    try:
        operator_settings.load({"POD_NAMESPACE": "ops"})  # the operator's own namespace
        spec = policy({"replicas": 3, "networkPolicy": {"clients": [team]}})
    finally:
        operator_settings.load({})
    (rule,) = spec["ingress"]
    assert ports(rule) == {("TCP", CONTAINER_PORT)}
    sources = rule["from"]
    assert team in sources
    assert {"podSelector": {"matchLabels": selector("ev")}} in sources  # peers
    operator = {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "durable-streams-operator"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
    }
    assert operator in sources
    assert any("prometheus" in str(s) for s in sources)
    out = spec["egress"]
    dns = next(r for r in out if ("UDP", 53) in ports(r))
    assert ports(dns) == {("UDP", 53), ("TCP", 53)} and "to" not in dns  # any resolver
    api = next(r for r in out if ("TCP", 6443) in ports(r))
    assert ports(api) == {("TCP", 443), ("TCP", 6443)}
    assert {"ipBlock": {"cidr": "0.0.0.0/0"}} in api["to"]
    peers = next(
        r for r in out if r.get("to") == [{"podSelector": {"matchLabels": selector("ev")}}]
    )
    assert ports(peers) == {("TCP", CONTAINER_PORT)}


def test_a_single_server_never_reaches_the_api_server() -> None:
    assert not [r for r in policy({})["egress"] if ("TCP", 6443) in ports(r)]


def test_object_stores_webhooks_and_chosen_clients() -> None:
    spec = {
        "replicas": 2,
        "backup": STORE,
        "server": {"subscriptions": {"webhookAllow": ["10.1.0.0/16", "*.hooks.svc"]}},
        "networkPolicy": {
            "clients": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
            "apiServerCIDRs": ["172.20.0.1/32"],
            "extraEgress": [{"ports": [{"protocol": "TCP", "port": 5432}]}],
        },
    }
    got = policy(spec)
    sources = got["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"team": "a"}}} in sources
    assert len(got["ingress"]) == 1 and {"podSelector": {}} not in sources
    out = got["egress"]
    assert any(("TCP", 9000) in ports(r) for r in out)  # the object store's port
    assert {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]} in out
    hooks = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "hooks"}}}
    assert {"to": [hooks]} in out
    api = next(r for r in out if ("TCP", 6443) in ports(r))
    assert api["to"] == [{"ipBlock": {"cidr": "172.20.0.1/32"}}]
    assert {"ports": [{"protocol": "TCP", "port": 5432}]} in out


def test_turned_off_by_the_spec_or_by_the_operators_default() -> None:
    off = {"replicas": 3, "networkPolicy": {"enabled": False}}
    assert "NetworkPolicy" not in [o["kind"] for o in desired_objects("ev", "ns", UID, off)]
    try:
        operator_settings.load({"DS_OPERATOR_NETWORK_POLICIES": "false"})
        kinds = [o["kind"] for o in desired_objects("ev", "ns", UID, {"replicas": 3})]
        assert "NetworkPolicy" not in kinds
        on = {"networkPolicy": {"enabled": True}}
        assert "NetworkPolicy" in [o["kind"] for o in desired_objects("ev", "ns", UID, on)]
    finally:
        operator_settings.load({})


@pytest.mark.processes
def test_the_chart_renders_the_operators_policy_and_passes_the_default() -> None:
    helm = helm_binary()
    docs = rendered(helm)
    (pol,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert pol["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8081}]}]
    egress_ports = {p["port"] for r in pol["spec"]["egress"] for p in r["ports"]}
    assert egress_ports == {53, 443, 6443, CONTAINER_PORT}
    off = rendered(helm, "operator.networkPolicies=false")
    assert "NetworkPolicy" not in [d["kind"] for d in off]
    (deployment,) = [d for d in off if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["DS_OPERATOR_NETWORK_POLICIES"] == "false"
