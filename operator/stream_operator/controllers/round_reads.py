"""One status round reads a DurableStream's claims once: an API client for the round that
answers a repeated list of PersistentVolumeClaims from its first answer.

Three parts of a status round list the claims (``scaling_actions.plan``, a replica
cluster's conditions, the status's volume sizes), each through ``apply.instance_pvcs``:
three identical lists a round, a few milliseconds apart, for every DurableStream every
status interval (docs/kubernetes.md, "API load"). Nothing in a status round writes a
claim and then lists them again (a claim is grown by a whole reconcile), so the first
answer is as true as the next two would be. Any other request goes through, and so does
every write, to the operator's client with its timeout and leadership check.

Glue: the kubernetes client's objects are untyped, so ``Any`` stays at this boundary.
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

_CLAIMS = "/persistentvolumeclaims"


def for_round(inner: client.ApiClient) -> client.ApiClient:
    """The client a round uses: ``inner`` in all but the claim lists."""
    return cast("client.ApiClient", _RoundReads(inner))


class _RoundReads:
    """``inner`` with its ``call_api``, where every request goes, answering the claim
    lists of the round once. Not a subclass: a new ApiClient would open a connection
    pool of its own each round."""

    def __init__(self, inner: client.ApiClient) -> None:
        self._inner = inner
        self._answers: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        # The client's own methods run on this object (they call ``self.call_api``), its
        # attributes (configuration, connection pool) are ``inner``'s.
        method = getattr(type(self._inner), name, None)
        if callable(method) and not isinstance(method, type):
            return method.__get__(self)
        return getattr(self._inner, name)

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() != "GET" or not url.split("?", 1)[0].endswith(_CLAIMS):
            return self._inner.call_api(method, url, *args, **kwargs)
        if url not in self._answers:
            answer: Any = self._inner.call_api(method, url, *args, **kwargs)
            answer.read()  # its body kept, for each deserialization of it
            self._answers[url] = answer
        return self._answers[url]
