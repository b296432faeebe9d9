"""Issue 42, "An emulator that behaves like a real API server": the emulated
kube-apiserver (testkit.kube, testkit.watch_cache, testkit.flow_control) answers as the
real one does where an operator that only ever met a patient API server would break,
and the real kopf operator copes.

The rules, from the Kubernetes documentation:

- "Efficient detection of changes" (API concepts): the API server keeps a limited
  window of changes; a watch from a resourceVersion older than it gets 410 Gone, as an
  ``ERROR`` event holding a Status ``Expired`` ("too old resource version"), and the
  client must list again; a list is not refused so.
- "Watch bookmarks" (API concepts): a watch that sets ``allowWatchBookmarks=true``
  may be sent ``BOOKMARK`` events, objects of the watched kind with only
  ``metadata.resourceVersion`` set, the point a client may resume from.
- "API Priority and Fairness" (cluster administration, flow control): a request the
  server will not queue is refused with 429 Too Many Requests, ``Retry-After`` and a
  Status whose reason is ``TooManyRequests``; client-go waits and sends it again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.operator import running_operator

NS = "default"
LAST_HANDLED = "streams.pyds.dev/last-handled-configuration"  # kopf's, as handlers.configure sets


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}}


def rv_of(c: Cluster, kind: str, name: str) -> str:
    obj = c.get(kind, NS, name)
    assert obj is not None
    return str(obj["metadata"]["resourceVersion"])


def current_rv(c: Cluster) -> str:
    r = c.http.get(c.path("ConfigMap", NS))
    r.raise_for_status()
    return str(r.json()["metadata"]["resourceVersion"])


def watching(c: Cluster, plural: str) -> int:
    """The watches of ``plural`` reading its events now (their replay is done)."""
    return sum(n for res, n in c.api.watches.open.items() if res.plural == plural)


def watch(c: Cluster, count: int, **params: str) -> list[dict[str, Any]]:
    """The first ``count`` events of a ConfigMap watch (fewer if the server ends it)."""
    events: list[dict[str, Any]] = []
    with c.http.stream("GET", c.path("ConfigMap", NS), params={"watch": "true", **params}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.strip():
                events.append(json.loads(line))
            if len(events) >= count:
                break
    return events


# -- the watch cache's window -------------------------------------------------------------


def test_a_watch_from_before_the_window_is_410_expired_and_a_list_is_not(kube: Cluster):
    kube.api.watches.window = 2
    for name in ("a", "b", "c", "d"):
        kube.create(configmap(name)).raise_for_status()
    a, b = rv_of(kube, "ConfigMap", "a"), rv_of(kube, "ConfigMap", "b")
    # The window holds c and d: a client that saw b has missed nothing, one that saw a has.
    events = watch(kube, 3, resourceVersion=a)
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {a} ({b})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ], "the error, then the end of the stream"
    served = watch(kube, 2, resourceVersion=b)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in served] == [
        ("ADDED", "c"),
        ("ADDED", "d"),
    ]
    listed = kube.http.get(kube.path("ConfigMap", NS), params={"resourceVersion": a})
    assert listed.status_code == 200 and len(listed.json()["items"]) == 4
    assert kube.api.watches.expired == 1


def test_compaction_expires_every_resource_version_before_it(kube: Cluster):
    kube.create(configmap("a")).raise_for_status()
    seen = rv_of(kube, "ConfigMap", "a")
    kube.create({**configmap("s"), "kind": "Secret"}).raise_for_status()  # another kind
    kube.api.watches.compact()
    now = current_rv(kube)
    assert int(now) > int(seen)
    [error] = watch(kube, 2, resourceVersion=seen)
    assert error["object"]["code"] == 410
    assert error["object"]["message"] == f"too old resource version: {seen} ({now})"
    # From the compaction on, a watch resumes.
    with kube.http.stream(
        "GET", kube.path("ConfigMap", NS), params={"watch": "true", "resourceVersion": now}
    ) as r:
        kube.create(configmap("b")).raise_for_status()
        first = json.loads(next(line for line in r.iter_lines() if line.strip()))
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "b")


def test_a_watch_the_server_ends_ends_for_the_client(kube: Cluster):
    """What a test uses to make a client watch again (the API server's restart)."""
    kube.create(configmap("a")).raise_for_status()
    with kube.http.stream(
        "GET", kube.path("ConfigMap", NS), params={"watch": "true", "resourceVersion": "0"}
    ) as r:
        lines = r.iter_lines()
        assert json.loads(next(line for line in lines if line.strip()))["type"] == "ADDED"
        wait_for(lambda: watching(kube, "configmaps"), message="the watch following events")
        kube.api.watches.end_all()
        assert [line for line in lines if line.strip()] == []  # the stream ended


# -- bookmarks ------------------------------------------------------------------------------


def test_a_watch_that_asks_for_bookmarks_is_sent_the_current_resource_version(kube: Cluster):
    kube.api.watches.bookmark_interval = 0.2
    start = current_rv(kube)
    params = {"watch": "true", "resourceVersion": start, "allowWatchBookmarks": "true"}
    with (
        kube.http.stream("GET", kube.path("ConfigMap", NS), params=params) as asked,
        kube.http.stream(
            "GET",
            kube.path("ConfigMap", NS),
            params={"watch": "true", "resourceVersion": start},
        ) as plain,
    ):
        wait_for(lambda: watching(kube, "configmaps") == 2, message="both watches following")
        events = (json.loads(line) for line in asked.iter_lines() if line.strip())
        assert next(events) == {
            "type": "BOOKMARK",
            "object": {
                "kind": "ConfigMap",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": start},
            },
        }
        # A write of another kind: nothing for this watch, but a newer point to resume from.
        kube.create({**configmap("s"), "kind": "Secret"}).raise_for_status()
        written = rv_of(kube, "Secret", "s")
        assert wait_for(
            lambda: next(events)["object"]["metadata"]["resourceVersion"] == written,
            message="a bookmark at the Secret's resourceVersion",
        )
        # The watch that did not ask: its first event is the next change, no bookmark.
        kube.create(configmap("a")).raise_for_status()
        first = json.loads(next(line for line in plain.iter_lines() if line.strip()))
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "a")
        # Bookmarks come only between events: the ADDED reaches the asking watch too.
        assert wait_for(lambda: next(events)["type"] == "ADDED", message="the ADDED event")


# -- API Priority and Fairness ---------------------------------------------------------------


def test_a_throttled_request_is_429_with_retry_after(kube: Cluster):
    kube.api.flow.throttle(2)
    for _ in range(2):
        r = kube.http.get(kube.path("ConfigMap", NS))
        assert r.status_code == 429
        assert r.headers["Retry-After"] == "1"
        assert r.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Too many requests, please try again later.",
            "reason": "TooManyRequests",
            "details": {"retryAfterSeconds": 1},
            "code": 429,
        }
    assert kube.http.get(kube.path("ConfigMap", NS)).status_code == 200
    # One flow (a client) throttled, the others served.
    kube.api.flow.throttle(1, agent="kopf/")
    assert kube.http.get(kube.path("ConfigMap", NS)).status_code == 200
    kopf = {"User-Agent": "kopf/1.45.2"}
    assert kube.http.get(kube.path("ConfigMap", NS), headers=kopf).status_code == 429
    assert kube.http.get(kube.path("ConfigMap", NS), headers=kopf).status_code == 200
    # A flow of writes: reads of the same client go on.
    kube.api.flow.throttle(1, methods=["post"])
    assert kube.http.get(kube.path("ConfigMap", NS)).status_code == 200
    assert kube.create(configmap("a")).status_code == 429
    assert kube.create(configmap("a")).status_code == 201
    with pytest.raises(ValueError, match="a number of requests"):
        kube.api.flow.throttle(-1)


# -- the operator copes ----------------------------------------------------------------------


def annotations(c: Cluster, name: str) -> dict[str, str]:
    ds = c.get("DurableStream", NS, name) or {}
    return ds.get("metadata", {}).get("annotations") or {}


def kopf_calls(c: Cluster, verb: str) -> int:
    """kopf's own list or watch requests of DurableStreams so far."""
    return sum(
        1
        for call in c.api.requests
        if (call.verb, call.resource) == (verb, "durablestreams") and call.agent.startswith("kopf/")
    )


@pytest.mark.slow
def test_the_operator_lists_again_after_410_and_still_reconciles(kube: Cluster):
    with running_operator(kube):
        wait_for(lambda: watching(kube, "durablestreams"), message="kopf watching DurableStreams")
        lists, watches = kopf_calls(kube, "list"), kopf_calls(kube, "watch")
        # A write kopf's DurableStream watch does not see, then the window forgets it:
        # kopf's resourceVersion is now older than any the server resumes from.
        kube.create(configmap("elsewhere")).raise_for_status()
        kube.api.watches.compact()
        kube.api.watches.end_all()
        wait_for(lambda: kube.api.watches.expired, message="a watch resumed from before")
        wait_for(
            lambda: kopf_calls(kube, "list") > lists and kopf_calls(kube, "watch") > watches + 1,
            message="kopf listing and watching DurableStreams again",
        )
        kube.create(durable_stream("after", {})).raise_for_status()
        wait_for(lambda: kube.get("StatefulSet", NS, "after"), message="the StatefulSet")


@pytest.mark.slow
def test_a_stream_created_in_a_burst_of_429s_converges(kube: Cluster):
    """kopf waits out Retry-After itself. The operator's client does so once per request
    (api_client): before, its first apply (a PATCH, which urllib3 does not send again)
    failed the reconcile, an ``ApplyFailed`` Warning, and a retry 10 s later."""
    with running_operator(kube):
        wait_for(lambda: watching(kube, "durablestreams"), message="kopf watching DurableStreams")
        kube.api.flow.throttle(3, agent="kopf/")
        kube.api.flow.throttle(1, agent="OpenAPI-Generator/", methods=["PATCH"])  # the operator
        kube.create(durable_stream("burst", {})).raise_for_status()
        wait_for(lambda: kube.get("StatefulSet", NS, "burst"), message="the StatefulSet")
        # The operator creates its Events at once, in order: the StatefulSet's after any
        # failure of its apply.
        kube.wait_for_event(NS, "burst", "Created", "StatefulSet")
        assert kube.events(NS, "burst", "ApplyFailed") == []
        # kopf's own writes (its record of the handled spec) are retried after each 429,
        # on its own time: wait until all three were refused and the record is there.
        wait_for(
            lambda: sum(a.startswith("kopf/") for a in kube.api.flow.throttled) == 3,
            message=lambda: f"three of kopf's requests refused: {kube.api.flow.throttled}",
        )
        wait_for(
            lambda: LAST_HANDLED in annotations(kube, "burst"),
            message="kopf's record of the handled spec on burst",
        )
    refused = kube.api.flow.throttled
    assert sum(a.startswith("kopf/") for a in refused) == 3
    assert sum(a.startswith("OpenAPI-Generator/") for a in refused) == 1
