"""Issue 42: a replica set given no certificate gets the operator's own CA (the real kopf
operator on the emulated API server): the CA and certificate Secrets appear, owned by
the DurableStream, the StatefulSet serves and checks TLS from them, a new pod name is
added by reissuing the certificate, and the RBAC grants every request made for it."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.operator import running_operator
from testkit.operator_rbac import assert_role_grants_what_the_operator_did

pytestmark = pytest.mark.slow

NS = "default"


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c, running_operator(c):
        yield c


def served_names(c: Cluster) -> list[str]:
    secret = c.get("Secret", NS, "events-tls") or {}
    pem = base64.b64decode((secret.get("data") or {}).get("tls.crt", ""))
    if not pem:
        return []
    cert = x509.load_pem_x509_certificate(pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.DNSName))


def container(c: Cluster) -> dict[str, Any]:
    sts = c.get("StatefulSet", NS, "events")
    return sts["spec"]["template"]["spec"]["containers"][0]


def test_a_replica_set_serves_tls_from_the_builtin_ca(kube: Cluster):
    kube.create(durable_stream("events", {"replicas": 3})).raise_for_status()
    wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="the StatefulSet")
    ca = kube.get("Secret", NS, "events-ca")
    tls = kube.get("Secret", NS, "events-tls")
    assert ca and tls, "the Secrets are made before the pods that mount them"
    assert tls["type"] == "kubernetes.io/tls"
    assert set(tls["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    uid = kube.get(KIND, NS, "events")["metadata"]["uid"]
    for secret in (ca, tls):
        assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [uid]
    assert "events-2.events-headless.default.svc" in served_names(kube)
    env = {e["name"]: e.get("value") for e in container(kube)["env"]}
    env |= kube.get("ConfigMap", NS, "events-config")["data"]
    assert env["DS_TLS_CERT"].endswith("/tls.crt")
    assert env["DS_REPLICATION_CA_FILE"].endswith("/ca.crt")
    assert env["DS_REPLICA_URL"].startswith("https://")
    sts = kube.get("StatefulSet", NS, "events")
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in volumes}[
        "tls"
    ] == "events-tls"
    # A fourth pod's name: the certificate is reissued (replaced in place).
    kube.patch(KIND, NS, "events", {"spec": {"replicas": 4}}).raise_for_status()
    wait_for(
        lambda: "events-3.events-headless.default.svc" in served_names(kube),
        message="the certificate reissued for events-3",
    )
    assert kube.get("Secret", NS, "events-ca")["data"] == ca["data"]  # the same CA
    # The right test_rbac.py's scenario does not use (its sets have an issuer).
    assert ("update", "secrets") in {(c.verb, c.resource) for c in kube.api.requests}
    assert_role_grants_what_the_operator_did(kube)


def test_a_single_server_or_an_opt_out_gets_no_ca(kube: Cluster):
    kube.create(durable_stream("events", {"replicas": 1})).raise_for_status()
    off = {"replicas": 3, "certificates": {"builtIn": False}}
    kube.create(durable_stream("plain", off)).raise_for_status()
    for name in ("events", "plain"):
        wait_for(lambda n=name: kube.get("StatefulSet", NS, n), message=name)
    assert not [s for s in kube.list("Secret", NS) if s["metadata"]["name"].endswith("-ca")]
    for name in ("events", "plain"):
        assert "DS_TLS_CERT" not in kube.get("ConfigMap", NS, f"{name}-config")["data"]


def test_a_set_that_served_plain_http_keeps_it_until_the_spec_asks_for_tls(kube: Cluster):
    """An operator upgrade that brings the built-in CA must not move a running set's
    clients from http:// to https:// behind their backs: the set (made here as an older
    operator made it, plain) is marked to keep plain HTTP, with an Event saying how to
    switch; ``certificates.builtIn: true`` then switches it."""
    plain = {"replicas": 3, "certificates": {"builtIn": False}}
    kube.create(durable_stream("events", plain)).raise_for_status()
    wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="the StatefulSet")
    # The older operator's object: no builtIn field at all (a merge patch's null removes it).
    gone = {"spec": {"certificates": {"builtIn": None}}}
    kube.patch(KIND, NS, "events", gone).raise_for_status()
    wait_for(
        lambda: (
            (kube.get(KIND, NS, "events")["metadata"].get("annotations") or {}).get(
                "streams.pyds.dev/plain-http"
            )
            == "true"
        ),
        message="the set marked to keep plain HTTP",
    )
    reasons = [e.get("reason") for e in kube.list("Event", NS)]
    assert "PlainHttpKept" in reasons
    assert kube.get("Secret", NS, "events-tls") is None
    assert "DS_TLS_CERT" not in kube.get("ConfigMap", NS, "events-config")["data"]
    # Asked for: TLS from the built-in CA.
    kube.patch(KIND, NS, "events", {"spec": {"certificates": {"builtIn": True}}}).raise_for_status()
    wait_for(
        lambda: "DS_TLS_CERT" in kube.get("ConfigMap", NS, "events-config")["data"],
        message="TLS once the spec asks",
    )
    assert kube.get("Secret", NS, "events-tls") is not None
