"""``spec.server.subscriptions.webhookCA``: the CAs https:// webhooks are checked against
(the server's ``--webhook-ca-file``), from a Secret's key mounted into the server pod.

A receiver inside the cluster usually has a certificate from a private CA (cert-manager's
issuer), which the public CAs the server trusts by default do not know: without this,
every delivery to it failed the TLS handshake. The server checks the bundle at start
(it must hold at least one certificate) and names the setting if it does not.
"""

from __future__ import annotations

from typing import Any

from stream_operator.api.spec import ServerSpec

DIR = "/etc/durable-streams/webhook-ca"
FILE = "ca.crt"
VOLUME = "webhook-ca"


def env(server: ServerSpec) -> dict[str, str]:
    """DS_WEBHOOK_CA_FILE where a CA is given (nothing otherwise: the public CAs)."""
    return {} if server.webhook_ca is None else {"DS_WEBHOOK_CA_FILE": f"{DIR}/{FILE}"}


def mount(server: ServerSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Secret's key as (volumes, the server container's mounts)."""
    ca = server.webhook_ca
    if ca is None:
        return [], []
    items = [{"key": ca.key, "path": FILE}]
    volume = {"name": VOLUME, "secret": {"secretName": ca.name, "items": items}}
    return [volume], [{"name": VOLUME, "mountPath": DIR, "readOnly": True}]
