"""The operator's Kubernetes API client: every request times out, and writes are refused
once this process may not act (``leadership.may_act``).

Glue: the kubernetes client's objects are untyped, so ``Any`` stays at this boundary.
"""

from __future__ import annotations

from typing import Any

import kopf
from kubernetes import client, config

from stream_operator import leadership, operator_settings

_api: client.ApiClient | None = None


def api() -> client.ApiClient:
    """In-cluster credentials in a pod, else the kubeconfig (set once, shared)."""
    global _api
    if _api is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        _api = new_api_client()
        # Which replica wrote what shows in the API server's audit log.
        _api.user_agent = f"durable-streams-operator ({leadership.identity()})"
    return _api


class _Timed(client.ApiClient):
    """An API client that gives every request a timeout: the client's default is to wait
    forever. A request given no timeout of its own gets ``DS_OPERATOR_API_TIMEOUT``
    (``operator_settings``): a request the API server (or the network) holds up fails,
    and the round that made it ends, instead of holding its worker.

    ``call_api`` is where every request of the generated API classes goes (kubernetes
    37 and later; the client has no ``request`` method any more).
    """

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None and len(args) < 4:
            kwargs["_request_timeout"] = operator_settings.current().api_timeout
        return super().call_api(method, url, *args, **kwargs)


class _LeaderOnlyWrites(_Timed):
    """An API client that refuses to write once this process may not act.

    ``may_act`` is checked when a reconcile or a status round starts; a process frozen
    in the middle of one (SIGSTOP, a stalled node) and thawed after another operator
    took the Lease would otherwise carry on with what it read before, and, say, prune
    what the new leader just created. Each write is checked here instead.
    """

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() not in ("GET", "HEAD", "OPTIONS") and not leadership.may_act():
            raise kopf.TemporaryError(f"not writing ({method} {url}): the lease is not held")
        return super().call_api(method, url, *args, **kwargs)


def new_api_client(
    configuration: client.Configuration | None = None, *, leader_only: bool = True
) -> client.ApiClient:
    """An API client whose requests time out, for ``configuration`` (None: the default,
    as loaded from the cluster or the kubeconfig). ``leader_only``: writes refused while
    this process may not act (the handlers' client); the leader election's own client,
    which writes the Lease to become leader, is not."""
    return (_LeaderOnlyWrites if leader_only else _Timed)(configuration)


def use_api_client(api_client: client.ApiClient) -> None:
    """Point the handlers at a given API server (tests, embedding)."""
    global _api
    _api = api_client
