"""A NetworkPolicy per DurableStream: its pods take only the traffic they
serve and reach only what they call.

Ingress, on the server's port only. By default from anywhere, as Strimzi's listeners
without ``networkPolicyPeers``: application teams reach a stream server from their own
namespaces (and through ingress controllers), and an operator upgrade that brings the
policy must not cut them off. Once ``spec.networkPolicy.clients`` (NetworkPolicyPeers)
names who may connect, the port takes only them and what the set itself needs:
- the replica set's peers (the same pod selector), for the stream, snapshot and switchover;
- the operator's pod (its namespace, ``OperatorSettings.namespace``, and its name label): status,
  switchover and backup calls;
- metrics scrapers: ``spec.networkPolicy.metricsFrom`` (default pods named
  ``prometheus`` in any namespace, as the Prometheus Operator labels them).
Kubelet probes come from the node, which Kubernetes' NetworkPolicy semantics always let
in (NetworkPolicy "does not apply to traffic from the node the pod runs on"), so none is needed.

Egress:
- DNS: port 53, UDP and TCP, to any address (cluster DNS is kube-system's kube-dns on
  most clusters, openshift-dns on OpenShift, a node-local cache's link-local address
  elsewhere: no one selector finds them all, and a peer's name that does not resolve
  stops replication);
- the API server (a replica set's servers keep their Lease): ports 443 and 6443 to
  ``spec.networkPolicy.apiServerCIDRs`` (default every address). The ``kubernetes``
  Service's endpoints are the control plane's host addresses, which no pod or namespace
  selector matches, so the usual ipBlock-and-port rule is the only one that works
  everywhere; narrow it to the control plane's addresses where they are known;
- the peers, on the server's port;
- the object store of every backup, recovery or replica source (the port of its
  ``endpointURL``; 443 for AWS S3) to any address;
- webhook targets (subscriptions): public ones over 443, and each ``webhookAllow``
  entry: a CIDR as an ipBlock, a ``*.ns.svc`` or ``host.ns.svc`` name as its namespace;
- ``spec.networkPolicy.extraEgress``: rules added as given.

On by default (``DS_OPERATOR_NETWORK_POLICIES``, the chart's
``operator.networkPolicies``); ``spec.networkPolicy.enabled`` decides for one
DurableStream. Pure functions: no API calls.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from stream_operator.api.spec import DurableStreamSpec
from stream_operator.configuration import operator_settings

OPERATOR_LABEL = {"app.kubernetes.io/name": "durable-streams-operator"}
PROMETHEUS = [
    {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
]
EVERYWHERE = ["0.0.0.0/0", "::/0"]
NAMESPACE_LABEL = "kubernetes.io/metadata.name"


def _raw(spec: DurableStreamSpec) -> Mapping[str, Any]:
    return spec.raw.get("networkPolicy") or {}


def enabled(spec: DurableStreamSpec) -> bool:
    """The DurableStream's own choice, else the operator's default."""
    own = _raw(spec).get("enabled")
    if isinstance(own, bool):
        return own
    return operator_settings.current().network_policies


def _ports(port: int, *protocols: str) -> list[dict[str, Any]]:
    return [{"protocol": p, "port": port} for p in protocols or ("TCP",)]


def _ip_blocks(cidrs: list[str]) -> list[dict[str, Any]]:
    return [{"ipBlock": {"cidr": c}} for c in cidrs]


def _store_ports(node: Any) -> Iterator[int]:
    """The port of every object store the spec names (endpointURL, else S3's 443)."""
    if isinstance(node, Mapping):
        if "destinationPath" in node:
            url = str(node.get("endpointURL") or "https://s3.amazonaws.com")
            parts = urlsplit(url)
            yield parts.port or (80 if parts.scheme == "http" else 443)
        for value in node.values():
            yield from _store_ports(value)
    elif isinstance(node, list):
        for value in node:
            yield from _store_ports(value)


def _webhook_rules(allowed: tuple[str, ...]) -> list[dict[str, Any]]:
    """Public targets over https, and each allowed private CIDR or namespace."""
    rules: list[dict[str, Any]] = [{"to": _ip_blocks(EVERYWHERE), "ports": _ports(443)}]
    for entry in allowed:
        try:
            cidr = str(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            labels = entry.split(".")
            # receiver.ns.svc, *.ns.svc[.cluster.local]: the namespace is before "svc".
            if "svc" in labels and labels.index("svc") >= 1:
                ns = labels[labels.index("svc") - 1]
                rules.append(
                    {"to": [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: ns}}}]}
                )
            continue
        rules.append({"to": [{"ipBlock": {"cidr": cidr}}]})
    return rules


def render_network_policy(
    name: str,
    namespace: str,
    meta: dict[str, Any],
    spec: DurableStreamSpec,
    pods: dict[str, str],
    port: int,
    operator_ns: str | None,
) -> dict[str, Any] | None:
    """The NetworkPolicy for the pods ``pods`` selects (None: turned off). ``meta`` is the
    owned object's metadata as render.py makes it; ``port`` the server's container port."""
    if not enabled(spec):
        return None
    raw = _raw(spec)
    operator: dict[str, Any] = {"podSelector": {"matchLabels": OPERATOR_LABEL}}
    operator["namespaceSelector"] = (
        {"matchLabels": {NAMESPACE_LABEL: operator_ns}} if operator_ns else {}
    )
    peers = [{"podSelector": {"matchLabels": pods}}]
    ingress: list[dict[str, Any]] = [{"ports": _ports(port)}]  # from anywhere (module doc)
    if clients := raw.get("clients"):
        sources = [*clients, *peers, operator, *(raw.get("metricsFrom") or PROMETHEUS)]
        ingress = [{"from": sources, "ports": _ports(port)}]
    egress: list[dict[str, Any]] = [
        {"ports": _ports(53, "UDP", "TCP")},  # DNS, wherever the cluster serves it
        {"to": peers, "ports": _ports(port)},
    ]
    if spec.replicated:
        api = raw.get("apiServerCIDRs") or EVERYWHERE
        egress.append({"to": _ip_blocks(api), "ports": _ports(443) + _ports(6443)})
    stores = sorted(set(_store_ports(spec.raw)))
    if stores:
        ports = [p for s in stores for p in _ports(s)]
        egress.append({"to": _ip_blocks(EVERYWHERE), "ports": ports})
    egress += _webhook_rules(spec.server.webhook_allow)
    egress += list(raw.get("extraEgress") or [])
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }
