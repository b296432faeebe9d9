"""What the kubelet reads from Secrets for a container's environment (``secretKeyRef``),
and the error that keeps a container from starting when one is missing."""

from __future__ import annotations

import base64
from typing import Any

from testkit.cluster import Cluster


class ContainerConfigError(Exception):
    """What keeps a container from starting, as the kubelet's CreateContainerConfigError
    (a Secret or key its env names does not exist): it stays waiting and is tried again."""


def secret_key_value(cluster: Cluster, namespace: str, ref: dict[str, Any]) -> str | None:
    """A ``secretKeyRef``'s value: the key of the Secret's ``data`` (base64) or, as the
    emulated API keeps a Secret written with it, its ``stringData``; None when the Secret
    or the key is missing."""
    assert cluster.http is not None
    r = cluster.http.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
    if r.status_code == 404:
        return None
    r.raise_for_status()
    secret = r.json()
    if ref["key"] in (secret.get("data") or {}):
        return base64.b64decode(secret["data"][ref["key"]]).decode()
    value = (secret.get("stringData") or {}).get(ref["key"])
    return None if value is None else str(value)
