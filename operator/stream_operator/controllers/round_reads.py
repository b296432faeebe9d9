"""One status round reads a DurableStream's claims once, and its StatefulSet, pods, claims
and Lease from the watch-fed cache once that answers: an API client for the round.

The cache (``kube.object_cache``) is asked through ``cached_reads``, which
``kube.apply``'s reads consult: until this round writes. After a write (a pod labelled
with its role, a pod deleted by the rolling update, the Lease's owner reference) the
round's later reads go to the API server, which has the write, where the watch may not
have delivered it yet; so does a read right after a switchover, which writes through a
server, not this client (``fresh``). Whole reconciles never read the cache.

Claims, when they are read from the API server:

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

from stream_operator.kube import object_cache

_CLAIMS = "/persistentvolumeclaims"


def for_round(
    inner: client.ApiClient, cache: object_cache.ObjectCache | None = None
) -> client.ApiClient:
    """The client a round uses: ``inner`` in all but the claim lists, and the reads
    ``cache`` answers until the round writes."""
    return cast("client.ApiClient", _RoundReads(inner, cache))


def fresh(ac: client.ApiClient) -> client.ApiClient:
    """A round's client that reads the API server from now on (a write went through a
    server, which this client cannot see); any other client as it is."""
    if isinstance(ac, _RoundReads):
        ac.wrote = True
    return ac


class _RoundReads:
    """``inner`` with its ``call_api``, where every request goes, answering the claim
    lists of the round once. Not a subclass: a new ApiClient would open a connection
    pool of its own each round."""

    def __init__(self, inner: client.ApiClient, cache: object_cache.ObjectCache | None) -> None:
        self._inner = inner
        self._answers: dict[str, Any] = {}
        self._cache = cache
        self.wrote = False

    def cached_reads(self) -> object_cache.ObjectCache | None:
        """The cache this round's reads may come from (``object_cache.reads_of``)."""
        return None if self.wrote else self._cache

    def __getattr__(self, name: str) -> Any:
        # The client's own methods run on this object (they call ``self.call_api``), its
        # attributes (configuration, connection pool) are ``inner``'s.
        method = getattr(type(self._inner), name, None)
        if callable(method) and not isinstance(method, type):
            return method.__get__(self)
        return getattr(self._inner, name)

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() != "GET":
            self.wrote = True
        if method.upper() != "GET" or not url.split("?", 1)[0].endswith(_CLAIMS):
            return self._inner.call_api(method, url, *args, **kwargs)
        if url not in self._answers:
            answer: Any = self._inner.call_api(method, url, *args, **kwargs)
            answer.read()  # its body kept, for each deserialization of it
            self._answers[url] = answer
        return self._answers[url]
