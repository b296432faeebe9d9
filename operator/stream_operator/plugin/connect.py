"""Which cluster, as whom, in which namespace: kubectl's own rules.

The kubeconfig is ``--kubeconfig``, else ``$KUBECONFIG`` (a list of files, merged),
else ``~/.kube/config``; the context is ``--context``, else the current one; the
namespace is ``-n/--namespace``, else the context's, else ``default``. With no
kubeconfig at all inside a pod, the pod's ServiceAccount and namespace, as kubectl
falls back to them.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from stream_operator.plugin import PluginError

# What the API server's audit log and the RBAC tests see (kubectl sends its own name too).
USER_AGENT = "kubectl-dstream"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def connect(
    kubeconfig: str | None, context: str | None, namespace: str | None
) -> tuple[client.ApiClient, str]:
    """An API client for the chosen context, and the namespace to work in."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    files = [Path(p).expanduser() for p in path.split(os.pathsep) if p]
    if not any(f.exists() for f in files) and os.environ.get("KUBERNETES_SERVICE_HOST"):
        if kubeconfig or context:
            raise PluginError(f"kubeconfig {path} not found")
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        inside = (
            SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
            if SERVICE_ACCOUNT_NAMESPACE.exists()
            else "default"
        )
        api = client.ApiClient(configuration)
        api.user_agent = USER_AGENT
        return api, namespace or inside
    try:
        contexts, current = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as exc:
        raise PluginError(f"cannot read the kubeconfig {path}: {exc}") from None
    if context is None:
        chosen = current
        if not chosen:
            raise PluginError(f"the kubeconfig {path} has no current context: use --context")
    else:
        chosen = next((c for c in contexts or [] if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(str(c.get("name")) for c in contexts or []) or "none"
            raise PluginError(f"context {context!r} not found in {path} (contexts: {names})")
    try:
        api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=path, context=chosen["name"], persist_config=False
        )
    except (ConfigException, OSError) as exc:
        raise PluginError(f"cannot use context {chosen['name']!r}: {exc}") from None
    api.user_agent = USER_AGENT
    return api, namespace or (chosen.get("context") or {}).get("namespace") or "default"
