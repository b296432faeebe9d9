"""The operator's Kubernetes API client: every request times out, writes are refused
once this process may not act (``leadership.may_act``), and in a pod the service-account
token is re-read as the kubelet rotates it.

The kubernetes client's own in-cluster hook (``load_incluster_config``) survives into
every client made from the default configuration (a deep copy keeps the function), but
re-reads the token only once a minute, whatever happened, and a 401 is the caller's
failure. Here the token is re-read when its file changed (a ``stat`` per request), and a
401 makes it be read again and the request sent once more, as the server's Lease client
does (``stream_server.replication.lease.kube_auth``). The CA file is read again by urllib3 for
each new connection. kopf's own connection (its ``login_via_client`` login) is not this
client: on a 401 kopf logs in again, which reads the files again, and retries.

A 429 with ``Retry-After`` (API Priority and Fairness refused the request before doing
anything) is waited out and the request sent once more, as client-go does for any verb.
urllib3's default ``Retry`` already does so for the idempotent methods (GET, PUT, DELETE:
three times) but not for POST and PATCH, every apply among them: the reconcile failed
(an ``ApplyFailed`` Warning and status) and was done again only 10 s later.

Glue: the kubernetes client's objects are untyped, so ``Any`` stays at this boundary.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.config import incluster_config
from urllib3.util.retry import Retry

from stream_operator.configuration import operator_settings
from stream_operator.kube import leadership

_api: client.ApiClient | None = None

# The longest Retry-After waited out: a longer wait fails the request (the handler's
# retry comes later anyway), rather than holding a worker.
MAX_RETRY_AFTER = 10.0


def api() -> client.ApiClient:
    """In-cluster credentials in a pod, else the kubeconfig (set once, shared)."""
    global _api
    if _api is None:
        token: ServiceAccountToken | None = None
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            token = ServiceAccountToken(Path(incluster_config.SERVICE_TOKEN_FILENAME))
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        _api = new_api_client()
        if token is not None:
            _api.configuration.refresh_api_key_hook = token
        # Which replica wrote what shows in the API server's audit log.
        _api.user_agent = f"durable-streams-operator ({leadership.identity()})"
    return _api


class ServiceAccountToken:
    """The configuration's ``refresh_api_key_hook`` in a pod: the token read again when
    its file changed (the kubelet swaps in a new file: new inode, mtime or size), or when
    ``force``d after a 401. One per process: a copied configuration shares it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def __call__(self, configuration: client.Configuration, *, force: bool = False) -> None:
        st = os.stat(self.path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if force or stamp != self._stamp:
            self._token = self.path.read_text().strip()
            self._stamp = stamp
        configuration.api_key["BearerToken"] = f"Bearer {self._token}"

    def __deepcopy__(self, memo: dict[int, Any]) -> ServiceAccountToken:
        return self  # the configuration is deep-copied per client: the file is one


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
        response = super().call_api(method, url, *args, **kwargs)
        wait = retry_after(response.status, response.headers)
        if wait is not None and method.upper() not in Retry.DEFAULT_ALLOWED_METHODS:
            response.read()  # type: ignore[no-untyped-call]
            time.sleep(wait)
            response = super().call_api(method, url, *args, **kwargs)
        token = self.configuration.refresh_api_key_hook
        if response.status != 401 or not isinstance(token, ServiceAccountToken):
            return response
        # A 401 is refused before anything is done: the token may have been swapped just
        # after it was read; read it again and send the request once more.
        response.read()  # type: ignore[no-untyped-call]
        token(self.configuration, force=True)
        headers = args[0] if args else kwargs.get("header_params")
        if isinstance(headers, dict):
            headers["authorization"] = self.configuration.get_api_key_with_prefix("BearerToken")
        return super().call_api(method, url, *args, **kwargs)


def retry_after(status: int, headers: Any) -> float | None:
    """How long to wait before sending a refused request once more: a 429's
    ``Retry-After`` in whole seconds (what kube-apiserver sends, and all client-go reads),
    at most ``MAX_RETRY_AFTER``; None: not to send it again (another status, no or an
    unreadable header, a wait too long)."""
    if status != 429 or headers is None:
        return None
    value = str(headers.get("Retry-After") or "").strip()
    if not value.isdigit() or int(value) > MAX_RETRY_AFTER:
        return None
    return float(value)


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
