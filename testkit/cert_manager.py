"""cert-manager's CA issuer in miniature: a Certificate object becomes its Secret.

What cert-manager does for a ``cert-manager.io/v1`` Certificate whose issuer is a CA
issuer: a key and a certificate signed by the CA for exactly the Certificate's
``dnsNames`` (and usages), written to ``spec.secretName`` as a ``kubernetes.io/tls``
Secret with ``tls.crt``, ``tls.key`` and the CA's ``ca.crt``. The Secret is owned by
no one (cert-manager leaves it when the Certificate goes, unless told otherwise).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from testkit.cluster import Cluster
from testkit.pki import PrivateCA

SERVER_AUTH, CLIENT_AUTH = "server auth", "client auth"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def issue(cluster: Cluster, ca: PrivateCA, certificate: dict[str, Any]) -> dict[str, Any]:
    """Write the Secret ``certificate`` asks for, signed by ``ca``; returns the Secret."""
    spec = certificate["spec"]
    usages = set(spec.get("usages") or [SERVER_AUTH])
    name = certificate["metadata"]["name"]
    issued = ca.issue(
        name,
        *spec.get("dnsNames") or [],
        client=usages == {CLIENT_AUTH},
        server_and_client={SERVER_AUTH, CLIENT_AUTH} <= usages,
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": spec["secretName"],
            "namespace": certificate["metadata"]["namespace"],
            "annotations": {
                "cert-manager.io/certificate-name": name,
                "cert-manager.io/issuer-name": spec["issuerRef"]["name"],
                "cert-manager.io/issuer-kind": spec["issuerRef"].get("kind", "Issuer"),
            },
        },
        "data": {
            "tls.crt": _b64(issued.cert),
            "tls.key": _b64(issued.key),
            "ca.crt": _b64(ca.cert),
        },
    }
    cluster.create(secret).raise_for_status()
    return secret
