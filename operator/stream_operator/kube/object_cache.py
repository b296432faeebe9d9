"""A read cache of the operator's own objects, fed by watches: what a status round reads
of a DurableStream's StatefulSet, pods, claims and Lease, without asking the API server.

A status round reads, per DurableStream every status interval, its StatefulSet, its pods
(a list), its claims (a list) and its Lease: four requests an object every 5 s, most of
the operator's API load (docs/kubernetes.md, "API load"). Here each of those kinds is
listed once per namespace and then watched from the list's resourceVersion (client-go's
informer: a watch resumed where it ended, with bookmarks so that a quiet watch resumes
from a recent version; a 410 Gone (the version left the API server's window) lists
again and replaces what was held, so nothing deleted in the gap stays; until that list
answers, it answers from what it held, as an informer serves its store through a
relist: a status round may report the state before the gap one interval late, and
nothing that writes reads from here). Only the
operator's labelled objects are selected (``app.kubernetes.io/name=durable-streams``,
the label of everything ``specs.render`` makes and of the claims of its StatefulSets);
the Leases are the servers' and carry no label of ours, so every Lease of the namespace
is watched (RBAC: list and watch on Leases in the watched namespaces).

A namespace is watched from the first DurableStream the operator sees in it (or the
first status round that asks; namespaced or cluster-wide, only the namespaces holding
DurableStreams are watched), and its rounds read the API directly until its lists
answered. Answers: ``UNKNOWN`` when a kind in a namespace has not been listed yet, or
its watch failed other than by 410 (the round then reads the API, as before);
otherwise what the last event said, a copy the caller may change. Who reads from here is the status round only (``round_reads``):
whole reconciles, writes and the reads just after one read the API itself.

Why not kopf's indexes: an index is fed by kopf's own watch, but kopf restarts a watch
after a 410 by listing again without dropping what it held (an object deleted in the
gap stays in the index), and an index is handed to handlers only, not to the periodic
workers' threads.

Glue: the kubernetes client's objects are untyped, so ``Any`` stays at this boundary.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Final

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from stream_operator.configuration import operator_settings

log = logging.getLogger(__name__)

# One watch request lasts this long on the API server, then is resumed from the last
# resourceVersion seen (an event's or a bookmark's).
WATCH_SECONDS = 300
# Everything the operator renders carries it (specs.render.labels, selector).
OWN_LABEL = "app.kubernetes.io/name=durable-streams"
# After a failure other than 410 (403: no RBAC; the API server gone), the next list.
RETRY_SECONDS = (1.0, 30.0)


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()  # the cache cannot answer: read the API


def _lister(kind: str) -> tuple[Callable[[client.ApiClient], Callable[..., Any]], str]:
    """The list method of ``kind`` (what a watch streams) and its label selector."""
    listers: dict[str, tuple[Callable[[client.ApiClient], Callable[..., Any]], str]] = {
        "StatefulSet": (lambda ac: client.AppsV1Api(ac).list_namespaced_stateful_set, OWN_LABEL),
        "Pod": (lambda ac: client.CoreV1Api(ac).list_namespaced_pod, OWN_LABEL),
        "PersistentVolumeClaim": (
            lambda ac: client.CoreV1Api(ac).list_namespaced_persistent_volume_claim,
            OWN_LABEL,
        ),
        "Lease": (lambda ac: client.CoordinationV1Api(ac).list_namespaced_lease, ""),
    }
    return listers[kind]


KINDS = ("StatefulSet", "Pod", "PersistentVolumeClaim", "Lease")


class Watched:
    """One kind in one namespace, listed and then watched on a thread of its own."""

    def __init__(
        self, ac: client.ApiClient, kind: str, namespace: str, stop: threading.Event
    ) -> None:
        self.kind, self.namespace = kind, namespace
        self._list, self._selector = _lister(kind)
        self._ac = ac
        self._stop = stop
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Any]] = {}
        self._synced = False
        self.lists = 0  # how many times it was listed (the first, and one per 410 or failure)
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"object-cache {kind} {namespace}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    @property
    def synced(self) -> bool:
        return self._synced

    def get(self, name: str) -> dict[str, Any] | _Unknown | None:
        with self._lock:
            if not self._synced:
                return UNKNOWN
            found = self._items.get(name)
        return copy.deepcopy(found)

    def items(self, wanted: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]] | _Unknown:
        """Copies of the held objects ``wanted`` picks (the caller's own test of a list
        from the API server, which may ignore a label selector): only those are copied."""
        with self._lock:
            if not self._synced:
                return UNKNOWN
            held = [o for o in self._items.values() if wanted(o)]
        return copy.deepcopy(held)

    def versions(self) -> dict[str, str]:
        """Each held object's resourceVersion (for tests: has the cache caught up?)."""
        with self._lock:
            return {n: o["metadata"].get("resourceVersion", "") for n, o in self._items.items()}

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist()
                failures = 0
                self._follow(version)
            except ApiException as exc:
                if exc.status == 410:  # the version left the window: list again
                    continue
                if self._stop.is_set():
                    return
                failures += 1
                self._failed(failures, exc.reason)
            except Exception as exc:
                if self._stop.is_set():
                    return  # stopped: its connection closed under it
                failures += 1
                self._failed(failures, repr(exc))
            else:
                continue
            self._synced = False  # the round reads the API until the next list answers
            self._stop.wait(min(RETRY_SECONDS[0] * 2 ** min(failures, 5), RETRY_SECONDS[1]))

    def _failed(self, failures: int, why: object) -> None:
        """Logged as a warning the first time in a row (no RBAC for it, say), then at
        debug level: the round reads the API meanwhile, and every retry would repeat it."""
        level = logging.WARNING if failures == 1 else logging.DEBUG
        log.log(level, "watching %s in %s: %s (reading the API)", self.kind, self.namespace, why)

    def _relist(self) -> str:
        """List, replace what was held (so nothing deleted unseen stays), return the
        list's resourceVersion to watch from."""
        timeout = operator_settings.current().api_timeout
        response = self._list(self._ac)(
            self.namespace,
            label_selector=self._selector,
            _preload_content=False,
            _request_timeout=timeout,
        )
        body = json.loads(response.data)
        with self._lock:
            self._items = {o["metadata"]["name"]: o for o in body.get("items") or []}
            self._synced = True
        self.lists += 1
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, version: str) -> None:
        """Apply the watch's events until it is stopped; each watch request resumed from
        the last version seen. A 410 is raised (``watch.Watch`` does, given a timeout)."""
        timeout = operator_settings.current().api_timeout
        while not self._stop.is_set():
            self._watch = watch.Watch()  # type: ignore[no-untyped-call]
            for event in self._watch.stream(  # type: ignore[no-untyped-call]
                self._list(self._ac),
                self.namespace,
                label_selector=self._selector,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=(timeout, WATCH_SECONDS + timeout),
            ):
                self._apply(event["type"], event["raw_object"])
                if self._stop.is_set():
                    return
            version = self._watch.resource_version or version

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK: only its version counts (watch.Watch keeps it)
        name = obj["metadata"]["name"]
        with self._lock:
            if kind == "DELETED":
                self._items.pop(name, None)
            else:
                self._items[name] = obj

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]


class ObjectCache:
    """The watched kinds of every namespace a status round asked for."""

    def __init__(self, ac: client.ApiClient) -> None:
        self._ac = ac
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watched: dict[tuple[str, str], Watched] = {}

    def watch(self, namespace: str) -> None:
        """Every kind in ``namespace`` watched from now on (once; the operator asks when
        it first sees a DurableStream there)."""
        with self._lock:
            if self._stop.is_set() or ("Pod", namespace) in self._watched:
                return
            for kind in KINDS:
                w = Watched(self._ac, kind, namespace, self._stop)
                self._watched[(kind, namespace)] = w
                w.start()

    def watched(self, kind: str, namespace: str) -> Watched:
        """``kind`` in ``namespace``, watched from now on if it was not yet."""
        self.watch(namespace)
        return self._watched[(kind, namespace)]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | _Unknown | None:
        if kind not in KINDS or self._stop.is_set():
            return UNKNOWN
        return self.watched(kind, namespace).get(name)

    def items(
        self, kind: str, namespace: str, wanted: Callable[[dict[str, Any]], bool]
    ) -> list[dict[str, Any]] | _Unknown:
        if kind not in KINDS or self._stop.is_set():
            return UNKNOWN
        return self.watched(kind, namespace).items(wanted)

    def synced(self, namespace: str) -> bool:
        return all(self.watched(kind, namespace).synced for kind in KINDS)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for w in self._watched.values():
                w.stop()


_cache: list[ObjectCache] = []  # the process's one cache, while the operator runs


def install(ac: client.ApiClient) -> ObjectCache:
    """The process's cache, reading through ``ac`` (a client of its own: a watch holds
    a connection of its pool for minutes)."""
    uninstall()
    cache = ObjectCache(ac)
    _cache.append(cache)
    return cache


def uninstall() -> None:
    while _cache:
        _cache.pop().stop()


def current() -> ObjectCache | None:
    return _cache[-1] if _cache else None


def reads_of(api_client: client.ApiClient) -> ObjectCache | None:
    """The cache a client's reads may be answered from: a status round's client says so
    (``round_reads``; none once the round wrote); any other client reads the API."""
    source = getattr(api_client, "cached_reads", None)
    cache = source() if callable(source) else None
    return cache if isinstance(cache, ObjectCache) else None
