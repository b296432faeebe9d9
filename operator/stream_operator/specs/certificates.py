"""The server's TLS certificate made by cert-manager: ``spec.certificates.issuerRef``.

With an issuer named, the operator renders a cert-manager ``Certificate`` for every name
a client, a peer or Prometheus reaches a pod by, and the server serves the Secret
cert-manager writes (``tls.crt``, ``tls.key``, and the issuer's ``ca.crt``, which the
standbys check the primary against and Prometheus checks every pod against). That
Secret takes the place of ``server.tlsSecretName``, which is for a Secret made some
other way: naming both is refused, since either would silently be ignored.

Pure functions: the handlers apply the Certificate only when cert-manager's CRD exists,
and otherwise say so in the ``Certificates`` condition.
"""

from __future__ import annotations

from typing import Any

from stream_operator.api.conditions import condition
from stream_operator.api.spec import (
    CERT_MANAGER_GROUP,
    DurableStreamSpec,
    IssuerRef,
    SpecInput,
    spec_of,
    with_defaults,
)


def issuer_ref(spec: SpecInput) -> IssuerRef | None:
    """The issuer the spec names, with cert-manager's defaults (kind Issuer, its group)."""
    return with_defaults(spec).certificates.issuer_ref


def certificate_name(name: str) -> str:
    return f"{name}-tls"


def certificate_secret(name: str, spec: SpecInput) -> str | None:
    """The Secret cert-manager writes for this DurableStream (None: no issuer named)."""
    certificates = with_defaults(spec).certificates
    if certificates.issuer_ref is None:
        return None
    return certificates.secret_name or certificate_name(name)


def builtin_secret(name: str, spec: SpecInput) -> str | None:
    """The Secret the operator's own CA signs into (builtin_ca.py), for a replica set given
    no certificate (None: one is given, a single server, or ``certificates.builtIn: false``):
    replication and the peer token never cross the pod network in clear text."""
    parsed = with_defaults(spec)
    given = parsed.certificates.issuer_ref is not None or parsed.server.tls_secret_name
    if given or not parsed.replicated or not parsed.certificates.built_in:
        return None
    return certificate_name(name)


def plain_http_kept(name: str, spec: DurableStreamSpec, statefulset: dict[str, Any] | None) -> bool:
    """Whether a replica set gets the built-in CA's TLS only by default while its live
    StatefulSet serves plain HTTP: a set an earlier operator made (or a single server
    being scaled up). Switching it would move every client's URL to https at once, on an
    operator upgrade nobody tied to the clients, so it keeps plain HTTP until
    ``certificates.builtIn: true`` asks (``spec.PLAIN_HTTP``)."""
    if statefulset is None or builtin_secret(name, spec) is None:
        return False
    if "builtIn" in (spec.raw.get("certificates") or {}):
        return False  # chosen in the spec
    pod = ((statefulset.get("spec") or {}).get("template") or {}).get("spec") or {}
    return "tls" not in [v.get("name") for v in pod.get("volumes") or []]  # render.py mounts it


def with_certificate(name: str, spec: SpecInput) -> DurableStreamSpec:
    """The spec as the server sees it: with an issuer named, or the built-in CA's
    certificate, ``server.tlsSecretName`` is that Secret, so that every place that serves
    or checks TLS (the pods' mount, probes, peer URLs, the endpoint, the PodMonitor's CA)
    follows it unchanged."""
    parsed = with_defaults(spec)
    secret = certificate_secret(name, parsed) or builtin_secret(name, parsed)
    if secret is None:
        return parsed
    return parsed.changed(server={**parsed.raw["server"], "tlsSecretName": secret})


def serves_tls(ds: dict[str, Any]) -> bool:
    """Whether a DurableStream's servers serve TLS (a Secret named, cert-manager's or the
    built-in CA's): how a pod is reached through the API server's proxy."""
    return bool(with_certificate(ds["metadata"]["name"], spec_of(ds)).server.tls_secret_name)


def refused_certificates(spec: SpecInput) -> str | None:
    """What the CRD's rule refuses (for a cluster that did not run it): two sources of
    the server's certificate, one of which would be ignored."""
    parsed = with_defaults(spec)
    if parsed.certificates.issuer_ref is not None and parsed.server.tls_secret_name:
        return (
            "server.tlsSecretName and certificates.issuerRef are both set: name the Secret "
            "to serve, or the issuer that makes it (certificates.secretName), not both"
        )
    return None


def dns_names(name: str, namespace: str, replicas: int) -> list[str]:
    """Every name a pod is reached by: the client Service and the standbys' Service in
    each short and long form, the headless Service's wildcard, and each pod by name
    (peers use ``<pod>.<name>-headless.<ns>.svc``; a wildcard covers them, and the pods
    are listed too for clients that do not accept wildcards)."""
    headless = f"{name}-headless.{namespace}.svc"
    out: list[str] = []
    for service in (name, f"{name}-replicas"):
        out += [
            service,
            f"{service}.{namespace}",
            f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local",
        ]
    out.append(f"*.{headless}")
    out += [f"{name}-{i}.{headless}" for i in range(replicas)]
    return out


def render_certificate(
    name: str, namespace: str, meta: dict[str, Any], spec: SpecInput
) -> dict[str, Any] | None:
    """The cert-manager Certificate (None: no issuer named). ``meta`` is the owned
    object's metadata (name, labels, owner reference) as render.py makes it.

    Usages: server auth, and client auth since a standby may present the same
    certificate to its primary; a new private key at every renewal (rotationPolicy
    Always), as cert-manager recommends and v1.18 made the default.
    """
    parsed = with_defaults(spec)
    ref = parsed.certificates.issuer_ref
    if ref is None:
        return None
    body: dict[str, Any] = {
        "secretName": certificate_secret(name, parsed),
        "issuerRef": {"name": ref.name, "kind": ref.kind, "group": ref.group},
        "dnsNames": dns_names(name, namespace, parsed.replicas),
        "usages": ["server auth", "client auth", "digital signature", "key encipherment"],
        "privateKey": {"rotationPolicy": "Always"},
    }
    if parsed.certificates.duration:
        body["duration"] = parsed.certificates.duration
    if parsed.certificates.renew_before:
        body["renewBefore"] = parsed.certificates.renew_before
    return {
        "apiVersion": f"{CERT_MANAGER_GROUP}/v1",
        "kind": "Certificate",
        "metadata": meta,
        "spec": body,
    }


def certificates_condition(name: str, spec: SpecInput, served: bool) -> list[dict[str, str]]:
    """The Certificates condition (none without an issuer): False while cert-manager's
    Certificate kind is not served (the pods wait for a Secret nobody makes), True with
    the Certificate, issuer and Secret once it is applied."""
    ref = issuer_ref(spec)
    if ref is None:
        return []
    if not served:
        message = (
            "certificates.issuerRef is set, but cert-manager is not installed (no "
            f"certificates.{CERT_MANAGER_GROUP} CRD): Secret {certificate_secret(name, spec)} "
            "is not made and the pods wait for it"
        )
        return [condition("Certificates", False, "CertManagerMissing", message)]
    message = (
        f"Certificate {certificate_name(name)} from {ref.kind} {ref.name}, "
        f"served from Secret {certificate_secret(name, spec)}"
    )
    return [condition("Certificates", True, "Requested", message)]
