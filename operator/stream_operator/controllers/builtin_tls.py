"""Keeps a replica set's built-in CA and server certificate Secrets (builtin_ca.py) up
to date: called at every reconcile, so the periodic resync renews before expiry.

Both Secrets are owned by the DurableStream (they go with it) and never rendered from
the spec: no apply overwrites them and no prune removes them. A write is a replace at
the resourceVersion read (a compare-and-swap): a 409 leaves it for the next round.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stream_operator import GROUP, PLURAL, VERSION
from stream_operator.api.spec import PLAIN_HTTP, DurableStreamSpec, SpecInput, with_defaults
from stream_operator.kube import events
from stream_operator.kube.apply import MERGE_PATCH, read
from stream_operator.specs import builtin_ca
from stream_operator.specs.certificates import builtin_secret, dns_names, plain_http_kept
from stream_operator.specs.render import labels, owner_reference


def ca_secret_name(name: str) -> str:
    return f"{name}-ca"


def _decoded(secret: dict[str, Any] | None) -> dict[str, str] | None:
    if secret is None:
        return None
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def _body(
    ds: dict[str, Any], name: str, kind: str, data: dict[str, str], old: dict[str, Any] | None
) -> dict[str, Any]:
    meta = ds["metadata"]
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels(meta["name"]),
            "ownerReferences": [owner_reference(meta["name"], meta["uid"])],
        },
        "type": kind,
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    if old is not None:
        out["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
    return out


def _write(ac: client.ApiClient, body: Any, old: dict[str, Any] | None) -> bool:
    """``body`` a plain dict: the client serializes it as it is."""
    core = client.CoreV1Api(ac)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        if old is None:
            core.create_namespaced_secret(namespace, body)
        else:
            core.replace_namespaced_secret(name, namespace, body)
    except ApiException as exc:
        if exc.status in (409, 404):  # someone else wrote first: the next round sees it
            return False
        raise
    return True


def keep_plain_http(
    ac: client.ApiClient, ds: dict[str, Any], spec: DurableStreamSpec, sts: dict[str, Any] | None
) -> bool:
    """Mark a replica set that serves plain HTTP to keep it (``plain_http_kept``), once,
    with an Event saying how to switch; True when ``ds`` (updated in place) was marked."""
    if not plain_http_kept(ds["metadata"]["name"], spec, sts):
        return False
    meta = ds["metadata"]
    client.CustomObjectsApi(ac).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        meta["namespace"],
        PLURAL,
        meta["name"],
        {"metadata": {"annotations": {PLAIN_HTTP: "true"}}},
        _content_type=MERGE_PATCH,
    )
    meta.setdefault("annotations", {})[PLAIN_HTTP] = "true"
    events.info(
        ds,
        reason="PlainHttpKept",
        message="this set serves plain HTTP, as it did before the operator's own CA became "
        "the default; it keeps it so its clients' http:// URLs keep working. Set "
        "spec.certificates.builtIn: true to serve TLS (clients then use https://)",
    )
    return True


def ensure(
    ac: client.ApiClient, ds: dict[str, Any], spec: SpecInput, now: datetime.datetime | None = None
) -> None:
    """One step of the CA's and the certificate's life (nothing without the built-in CA)."""
    meta = ds["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    tls_name = builtin_secret(name, spec)
    if tls_name is None:
        return
    ca_old = read(ac, "Secret", namespace, ca_secret_name(name))
    tls_old = read(ac, "Secret", namespace, tls_name)
    names = dns_names(name, namespace, with_defaults(spec).replicas)
    wanted = builtin_ca.step(
        f"{namespace}/{name} durable-streams CA",
        _decoded(ca_old),
        _decoded(tls_old),
        names,
        now or datetime.datetime.now(datetime.UTC),
    )
    # The CA first: a certificate is never served that the stored CA did not sign.
    if wanted.ca is not None:
        body = _body(ds, ca_secret_name(name), "Opaque", wanted.ca, ca_old)
        if not _write(ac, body, ca_old):
            return
    if wanted.tls is not None:
        body = _body(ds, tls_name, "kubernetes.io/tls", wanted.tls, tls_old)
        if not _write(ac, body, tls_old):
            return
    if wanted.ca is not None or wanted.tls is not None:
        events.info(ds, reason="Certificates", message=f"Secret {tls_name}: {wanted.why}")
