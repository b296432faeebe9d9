"""The operator's API requests in a steady state, counted per round: what each periodic
round (a status round every ``DS_OPERATOR_STATUS_INTERVAL``, a whole reconcile every
``DS_OPERATOR_RESYNC_INTERVAL``) asks of the API server for N DurableStreams that have
converged (e2e/api_load_figures.py prints them, tests/operator/test_api_load.py checks
them).

The rounds are the operator's own functions (``status_round.refresh``,
``reconcile.converge``) called as its workers call them, against the emulated API
server, which records every request (``ApiServer.requests``); the test plays the
StatefulSet controller and the kubelet (every pod made and Ready, the StatefulSet's
status as its controller reports it) and, for a replica set, the servers' Lease. Rounds
are counted, not timed: requests per minute are a round's requests times the rounds a
minute holds at the operator's default intervals. The CPU figure is the thread time the
operator's calls took (the emulator runs in another thread).

With ``cached`` (the operator as it runs), the operator's watch-fed cache
(``object_cache``) is installed on a client of its own (``CACHE_AGENT``): its lists and
watches are counted apart (``Figures.cache``, once, not per round), and the rounds are
measured once it holds what the API server holds (``caught_up``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from kubernetes import client

from stream_operator.configuration import operator_settings
from stream_operator.controllers import reconcile, status_round
from stream_operator.controllers.periodic import Periodic
from stream_operator.kube import events, object_cache
from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.leases import replica_lease
from testkit.pod_objects import claim_volumes, pod_object, pod_status, statefulset_status

NS = "load"
OPERATOR_AGENT = "OpenAPI-Generator"  # the handlers' client (the plugin's is kubectl-dstream)
CACHE_AGENT = "api-load object-cache"  # the watch-fed cache's client
Tally = Counter[tuple[str, str]]  # (verb, resource) -> requests


@dataclass
class Figures:
    count: int
    replicas: int
    status_round: Tally  # one status round of every DurableStream
    resync: Tally  # one whole reconcile of every DurableStream
    status_cpu: float  # seconds of the operator's thread, one status round of all
    resync_cpu: float
    cache: Tally  # the watch-fed cache's requests, from its start (empty: not installed)

    def per_minute(self) -> Tally:
        tuning = operator_settings.OperatorSettings()
        out: Tally = Counter()
        for key, n in self.status_round.items():
            out[key] += round(n * 60 / tuning.status_interval)
        for key, n in self.resync.items():
            out[key] += round(n * 60 / tuning.resync_interval)
        return out

    def cpu_per_minute(self) -> float:
        tuning = operator_settings.OperatorSettings()
        return (
            self.status_cpu * 60 / tuning.status_interval
            + self.resync_cpu * 60 / tuning.resync_interval
        )


def _tally(c: Cluster, start: int, agent: str = OPERATOR_AGENT) -> Tally:
    return Counter(
        (call.verb, call.resource)
        for call in c.api.requests[start:]
        if call.agent.startswith(agent)
    )


@contextmanager
def watch_cache(c: Cluster) -> Iterator[object_cache.ObjectCache]:
    """The operator's watch-fed cache against ``c``, as ``handlers.configure`` installs
    it, on a client whose requests ``CACHE_AGENT`` tells apart; uninstalled after."""
    ac = api_client(c)
    ac.user_agent = CACHE_AGENT
    cache = object_cache.install(ac)
    try:
        yield cache
    finally:
        object_cache.uninstall()


def caught_up(c: Cluster, cache: object_cache.ObjectCache, namespace: str = NS) -> bool:
    """Whether the cache holds, of each watched kind, what the API server holds now."""
    if not cache.synced(namespace):
        return False
    for kind in object_cache.KINDS:
        selector = "" if kind == "Lease" else object_cache.OWN_LABEL
        live = {
            o["metadata"]["name"]: o["metadata"]["resourceVersion"]
            for o in c.list(kind, namespace, selector)
        }
        if cache.watched(kind, namespace).versions() != live:
            return False
    return True


def settle(c: Cluster, cache: object_cache.ObjectCache | None) -> None:
    """Wait until the cache (if any) caught up with the rounds' and the test's writes."""
    if cache is not None:
        cache.watched("Pod", NS)  # watched from now (a status round would start it)
        wait_for(lambda: caught_up(c, cache), message="the object cache never caught up")


@contextmanager
def without_events() -> Iterator[None]:
    """Events are not the load measured here (and go through the operator's own client,
    which these rounds do not set up): none is posted inside the block. Restored after:
    left in place, it silenced every later test's Events in the same process."""
    saved = events.post
    events.post = lambda *_, **__: None  # type: ignore[assignment]
    try:
        yield
    finally:
        events.post = saved  # type: ignore[assignment]


def converged(c: Cluster, count: int, replicas: int) -> list[str]:
    """``count`` DurableStreams of ``replicas`` each, made, rendered and running (inside
    ``without_events``)."""
    ac = api_client(c)
    names = [f"s{i:03d}" for i in range(count)]
    log = logging.getLogger("api_load")
    for name in names:
        c.create(durable_stream(name, {"replicas": replicas}, NS)).raise_for_status()
        reconcile.converge(ac, name, NS, log, Periodic(lambda *_: None))
        sts = c.get("StatefulSet", NS, name)
        assert sts is not None, name
        claim_volumes(c, sts)
        container = sts["spec"]["template"]["spec"]["containers"][0]
        rev = f"{name}-{sts['metadata']['generation']}"
        for i in range(replicas):
            c.create(pod_object(sts, i, rev)).raise_for_status()
            status = pod_status(container, ready=True, restarts=0)
            c.patch("Pod", NS, f"{name}-{i}", {"status": status}, status=True).raise_for_status()
        status = statefulset_status(sts, replicas, replicas, replicas, rev, rev)
        c.patch("StatefulSet", NS, name, {"status": status}, status=True).raise_for_status()
        if replicas > 1:
            standbys = [f"{name}-{i}" for i in range(1, replicas)]
            c.create(replica_lease(name, NS, f"{name}-0", 1, standbys)).raise_for_status()
    return names


def api_client(c: Cluster) -> client.ApiClient:
    return client.ApiClient(client.Configuration(host=c.url))


def one_round(c: Cluster, names: list[str], *, resync: bool) -> tuple[Tally, float]:
    """One round of every DurableStream, as the workers run it: its requests and CPU."""
    ac = api_client(c)
    rounds = Periodic(lambda *_: None)
    log = logging.getLogger("api_load")
    start = len(c.api.requests)
    cpu = time.thread_time()
    for name in names:
        if resync or status_round.refresh(ac, name, NS, rounds):
            reconcile.converge(ac, name, NS, log, rounds)
    return _tally(c, start), time.thread_time() - cpu


def measure(
    c: Cluster, count: int, replicas: int, settling: int = 2, *, cached: bool = True
) -> Figures:
    """The figures once ``settling`` rounds of each kind have run (the first rounds after
    a create write the status, the Lease's owner reference, the role labels), with the
    operator's watch-fed cache or (``cached=False``) without it, as before it was."""
    with without_events(), watch_cache(c) if cached else nullcontext() as cache:
        start = len(c.api.requests)
        names = converged(c, count, replicas)
        for _ in range(settling):
            one_round(c, names, resync=True)
            one_round(c, names, resync=False)
        settle(c, cache)
        resync, resync_cpu = one_round(c, names, resync=True)
        settle(c, cache)
        status, status_cpu = one_round(c, names, resync=False)
        watches = _tally(c, start, CACHE_AGENT)
    return Figures(count, replicas, status, resync, status_cpu, resync_cpu, watches)


def _verbs(tally: Tally) -> str:
    """``list 4, watch 4`` (the cache's requests by verb), or ``off``."""
    by_verb: Counter[str] = Counter()
    for (verb, _), n in tally.items():
        by_verb[verb] += n
    return ", ".join(f"{verb} {n}" for verb, n in sorted(by_verb.items())) or "off"


def table(figures: Figures) -> str:
    """The requests a minute by verb and resource, and the CPU, as the docs print them."""
    minute = figures.per_minute()
    lines = [
        f"{figures.count} DurableStreams x {figures.replicas} replica(s): "
        f"{sum(minute.values())} requests/min, "
        f"CPU {figures.cpu_per_minute():.1f} s/min of the operator's thread",
        f"  watch cache: {_verbs(figures.cache)} (once, then a watch request per "
        f"kind every {object_cache.WATCH_SECONDS} s)",
        f"  {'VERB':<7} {'RESOURCE':<28} {'STATUS ROUND':>12} {'RESYNC':>7} {'PER MIN':>8}",
    ]
    for verb, resource in sorted(minute, key=lambda k: -minute[k]):
        lines.append(
            f"  {verb:<7} {resource:<28} {figures.status_round[(verb, resource)]:>12} "
            f"{figures.resync[(verb, resource)]:>7} {minute[(verb, resource)]:>8}"
        )
    return "\n".join(lines)
