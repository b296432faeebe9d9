"""Issue 25: every pod scraped (a PodMonitor), and the server's certificate from cert-manager.

Pure rendering, no cluster: what ``spec.metrics.podMonitor`` and
``spec.certificates.issuerRef`` become, checked against the
published CRD schemas of the Prometheus Operator and cert-manager
(tests/operator/crds/README.md) and against the DurableStream CRD's own rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from stream_operator.api.spec import with_defaults
from stream_operator.specs.certificates import (
    certificates_condition,
    dns_names,
    refused_certificates,
    with_certificate,
)
from stream_operator.specs.render import (
    config_hash,
    desired_objects,
    endpoint,
    pod_url,
    render_statefulset,
    replication_env,
    selector,
)
from testkit.kube import (
    CERTIFICATE_CRD_SCHEMA,
    CRD_FILE,
    PODMONITOR_CRD_SCHEMA,
    openapi_as_jsonschema,
)

UID = "uid-1"
# Without the built-in CA: plain HTTP unless a certificate is asked for (builtin_ca.py).
THREE = {"replicas": 3, "certificates": {"builtIn": False}}
ISSUER = {"certificates": {"issuerRef": {"name": "private-ca", "kind": "ClusterIssuer"}}}


def published(path: Path) -> dict[str, Any]:
    return openapi_as_jsonschema(json.loads(path.read_text())["openAPIV3Schema"])


def crd_validates(spec: dict[str, Any]) -> None:
    """The DurableStream CRD's schema (CEL rules aside: see the kopf tests)."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    schema = openapi_as_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    obj = {"apiVersion": "streams.pyds.dev/v1alpha1", "kind": "DurableStream"}
    jsonschema.validate({**obj, "metadata": {"name": "ev"}, "spec": spec}, schema)


def kinds(spec: dict[str, Any], **crds: bool) -> list[str]:
    return [o["kind"] for o in desired_objects("ev", "ns", UID, spec, **crds)]


def only(spec: dict[str, Any], kind: str, **crds: bool) -> dict[str, Any]:
    (obj,) = [o for o in desired_objects("ev", "ns", UID, spec, **crds) if o["kind"] == kind]
    return obj


# -- PodMonitor -------------------------------------------------------------------------


def test_a_podmonitor_only_when_asked_and_its_crd_exists():
    on = {"metrics": {"podMonitor": {"enabled": True}}}
    crd_validates(on)
    assert "PodMonitor" not in kinds(on, podmonitor_crd=False)
    assert "PodMonitor" not in kinds({}, podmonitor_crd=True)
    assert "PodMonitor" in kinds(on, podmonitor_crd=True)


def test_the_podmonitor_selects_every_server_pod_primary_and_standbys():
    """Before: a ServiceMonitor on the client Service, whose selector is the primary's."""
    objs = desired_objects("ev", "ns", UID, {**THREE, "metrics": {"podMonitor": {"enabled": True}}},
                           podmonitor_crd=True)  # fmt: skip
    pm = next(o for o in objs if o["kind"] == "PodMonitor")
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    wanted = pm["spec"]["selector"]["matchLabels"]
    assert wanted == selector("ev") == sts["spec"]["selector"]["matchLabels"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    for role in ("primary", "standby"):  # the role label the pods carry does not matter
        assert wanted.items() <= {**pod_labels, "streams.pyds.dev/role": role}.items()
    assert "streams.pyds.dev/role" not in wanted
    # Once per pod, on the server's named port; job from the pods' name label.
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    port_names = [p["name"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]]
    assert ep["port"] == "http" and port_names == ["http"]
    assert ep == {"port": "http", "path": "/metrics", "interval": "30s", "scheme": "http"}
    assert pm["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert pod_labels["app.kubernetes.io/name"] == "durable-streams"  # job="durable-streams"
    jsonschema.validate(pm, published(PODMONITOR_CRD_SCHEMA))


def test_podmonitor_tls_checks_a_name_every_pods_certificate_carries():
    """Pods are scraped by IP: the name checked is the client Service's, which the
    operator's Certificate gives every pod."""
    spec = {**THREE, **ISSUER, "metrics": {"podMonitor": {"enabled": True}}}
    crd_validates(spec)
    objs = desired_objects("ev", "ns", UID, spec, podmonitor_crd=True, certificate_crd=True)
    pm = next(o for o in objs if o["kind"] == "PodMonitor")
    cert = next(o for o in objs if o["kind"] == "Certificate")
    ep = pm["spec"]["podMetricsEndpoints"][0]
    assert ep["scheme"] == "https"
    assert ep["tlsConfig"] == {
        "ca": {"secret": {"name": "ev-tls", "key": "ca.crt"}},
        "serverName": "ev.ns.svc",
    }
    assert ep["tlsConfig"]["serverName"] in cert["spec"]["dnsNames"]
    jsonschema.validate(pm, published(PODMONITOR_CRD_SCHEMA))


# -- cert-manager Certificate -----------------------------------------------------------


def test_the_certificate_names_every_way_a_pod_is_reached():
    spec = {**THREE, **ISSUER}
    crd_validates(spec)
    cert = only(spec, "Certificate", certificate_crd=True)
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["metadata"]["name"] == "ev-tls"
    assert cert["metadata"]["ownerReferences"][0]["name"] == "ev"
    assert cert["metadata"]["labels"]["app.kubernetes.io/instance"] == "ev"
    body = cert["spec"]
    assert body["secretName"] == "ev-tls"
    assert body["issuerRef"] == {
        "name": "private-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    names = body["dnsNames"]
    for service in ("ev", "ev-replicas"):
        for suffix in ("", ".ns", ".ns.svc", ".ns.svc.cluster.local"):
            assert service + suffix in names
    assert "*.ev-headless.ns.svc" in names
    assert [n for n in names if n.startswith("ev-") and ".ev-headless." in n] == [
        "ev-0.ev-headless.ns.svc",
        "ev-1.ev-headless.ns.svc",
        "ev-2.ev-headless.ns.svc",
    ]
    assert len(names) == len(set(names)) == len(dns_names("ev", "ns", 3))
    assert {"server auth", "client auth"} <= set(body["usages"])
    assert body["privateKey"] == {"rotationPolicy": "Always"}
    jsonschema.validate(cert, published(CERTIFICATE_CRD_SCHEMA))
    # Rendered before the StatefulSet whose pods mount its Secret.
    order = kinds(spec, certificate_crd=True)
    assert order.index("Certificate") < order.index("StatefulSet")


def test_every_peer_url_is_a_name_in_the_certificate():
    """The standbys check the primary at the URL it publishes (DS_REPLICA_URL)."""
    spec = {**THREE, **ISSUER}
    names = only(spec, "Certificate", certificate_crd=True)["spec"]["dnsNames"]
    for i in range(3):
        host = pod_url("ev", "ns", f"ev-{i}", spec).split("://")[1].rsplit(":", 1)[0]
        assert host in names
    assert pod_url("ev", "ns", "ev-0", spec).startswith("https://")
    assert endpoint("ev", "ns", spec).startswith("https://ev.ns.svc:")


def test_the_servers_serve_the_certificates_secret():
    spec = {**THREE, **ISSUER, "certificates": {**ISSUER["certificates"], "secretName": "own"}}
    crd_validates(spec)
    objs = desired_objects("ev", "ns", UID, spec, certificate_crd=True)
    cert = next(o for o in objs if o["kind"] == "Certificate")
    assert cert["spec"]["secretName"] == "own"
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    tls = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert tls == [{"name": "tls", "secret": {"secretName": "own"}}]
    config = next(o for o in objs if o["kind"] == "ConfigMap")["data"]
    assert config["DS_TLS_CERT"].endswith("/tls.crt")
    assert config["DS_REPLICATION_CA_FILE"].endswith("/ca.crt")
    probe = sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTPS"
    # Same as naming that Secret in server.tlsSecretName (the pods are the same).
    by_name = {**THREE, "server": {"tlsSecretName": "own"}}
    assert render_statefulset("ev", "ns", UID, with_certificate("ev", spec)) == (
        render_statefulset("ev", "ns", UID, by_name)
    )
    assert replication_env("ev", "ns", with_certificate("ev", spec)) == replication_env(
        "ev", "ns", by_name
    )
    # Asking for an issuer restarts the pods onto TLS; a spec without one hashes as before.
    assert config_hash(with_certificate("ev", spec)) != config_hash(THREE)
    three = with_defaults(THREE)
    assert with_certificate("ev", three) is three


def test_no_certificate_without_its_crd_and_a_condition_says_why():
    spec = {**THREE, **ISSUER}
    assert "Certificate" not in kinds(spec, certificate_crd=False)
    (missing,) = certificates_condition("ev", spec, served=False)
    assert (missing["type"], missing["status"], missing["reason"]) == (
        "Certificates",
        "False",
        "CertManagerMissing",
    )
    assert "ev-tls" in missing["message"]
    (ok,) = certificates_condition("ev", spec, served=True)
    assert ok["status"] == "True" and "ClusterIssuer private-ca" in ok["message"]
    assert certificates_condition("ev", THREE, served=True) == []


def test_an_issuer_and_a_named_secret_at_once_are_refused():
    both = {**ISSUER, "server": {"tlsSecretName": "mine"}}
    assert "both" in (refused_certificates(both) or "")
    assert refused_certificates(ISSUER) is None
    assert refused_certificates({"server": {"tlsSecretName": "mine"}}) is None
    crd = yaml.safe_load(CRD_FILE.read_text())
    rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ]
    assert any(
        "certificates.issuerRef" in r["rule"] and "tlsSecretName" in r["rule"] for r in rules
    )
    with pytest.raises(jsonschema.ValidationError):  # ClusterIssuer or Issuer only
        crd_validates({"certificates": {"issuerRef": {"name": "x", "kind": "Vault"}}})
