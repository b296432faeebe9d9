"""A real Prometheus scrapes real servers under traffic; every dashboard query
and every alert expression runs through its HTTP API.

Two servers, labelled as the Prometheus Operator would label pods
(namespace ``obs``, pods ``ds-0`` and ``ds-1``, job ``orders`` as if named
after a DurableStream's Service): ``ds-0`` takes steady
traffic (creates, a fork, a TTL'd stream, appends, idempotent-producer
duplicates, catch-up reads, long-poll and SSE readers, 404s and 409s);
``ds-1`` is made to fail closed (an injected EIO on a WAL flush) once
Prometheus has scraped it healthy. Prometheus also scrapes itself: a
non-durable-streams target whose ``process_*`` series the dashboard must
leave out.

What is checked:

* the dashboard's template variables (``label_values``) find the namespace,
  both pods and both instances;
* every query of every panel (variables set to "All", ``$__rate_interval``
  15s) returns at least one series. Nothing is allowed to be empty: the
  server creates its labelled counters (producer events, deletions by reason,
  batch failures by reason) at zero, so even "nothing happened" is a series.
  NaN is allowed only from ``histogram_quantile`` (a zero rate over the window,
  e.g. a method that saw no request), and then only for some series: each
  quantile query must give at least one finite value, since traffic keeps
  every histogram moving. Every other value must be finite;
* panels that traffic must move are positive; the pod variable narrows;
  the process row holds the two servers and not Prometheus;
* every alert expression answers; the rules loaded with health ok; and the
  alerts that must react do so on the failed server only: storage failed
  closed and batch failures firing, not-ready and 5xx ratio pending (their
  ``for:`` is minutes), nothing deterministic about ds-0. (Latency and disk
  alerts depend on the machine, so they are not asserted either way.) Then
  ds-1 is killed and its target-down alert goes pending;
* the healthy server's JSON log has the slow-append line (its threshold is 0
  here, so every append is "slow" and the slow-append panel has data).
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid

import httpx
import pytest

from testkit import needs
from testkit.prometheus import (
    ALL,
    RATE_INTERVAL,
    Prometheus,
    alert_rules,
    background,
    panel_queries,
    substitute,
    until_no_problems,
    variables,
)

BIN = {"Content-Type": "application/octet-stream"}

pytestmark = [
    pytest.mark.processes,
    needs.commands("prometheus", install="Debian's prometheus package (make system-deps)"),
]


# Traffic ---------------------------------------------------------------------


def setup_streams(srv) -> str:
    """One-off traffic, each response checked; returns the stream to append to."""
    with httpx.Client(timeout=10) as c:
        name = f"obs/{uuid.uuid4().hex}"
        url = srv.base + name
        assert c.put(url, headers=BIN).status_code == 201
        assert c.put(url, headers=BIN).status_code in (200, 204)  # idempotent re-create
        fork = c.put(f"{url}-fork", headers=BIN | {"Stream-Forked-From": name})
        assert fork.status_code == 201, fork.text
        assert c.put(f"{url}-gone", headers=BIN).status_code == 201
        assert c.delete(f"{url}-gone").status_code in (200, 204)
        assert c.put(f"{url}-ttl", headers=BIN | {"Stream-TTL": "1"}).status_code == 201
        assert c.get(f"{url}-missing", params={"offset": "-1"}).status_code == 404
        # A pull-wake subscription over the stream: appends wake it (append_loop claims).
        json_type = {"Content-Type": "application/json"}
        assert c.put(f"{url}-wake", headers=json_type, content=b"[]").status_code == 201
        sub = {"type": "pull-wake", "streams": [name], "wake_stream": f"{name}-wake"}
        assert c.put(f"{srv.base}__ds/subscriptions/obs", json=sub).status_code == 201
        return url


def append_loop(c: httpx.Client, url: str, seq: int) -> None:
    assert c.post(url, headers=BIN, content=b"x" * 100).status_code == 204
    producer = {"Producer-Id": "obs", "Producer-Epoch": "0", "Producer-Seq": str(seq)}
    assert c.post(url, headers=BIN | producer, content=b"p").status_code == 200
    assert c.post(url, headers=BIN | producer, content=b"p").status_code == 204  # duplicate
    assert c.get(url, params={"offset": "-1"}).status_code == 200  # catch-up read
    wrong_type = c.post(url, headers={"Content-Type": "text/plain"}, content=b"no")
    assert wrong_type.status_code == 409
    assert c.get(f"{url}-missing", params={"offset": "-1"}).status_code == 404
    claim_and_ack(c, url.split("/v1/stream/")[0] + "/v1/stream/__ds/subscriptions/obs")


def claim_and_ack(c: httpx.Client, sub: str) -> None:
    """Take the subscription's wake, ack everything it lists, so the next append wakes again."""
    r = c.post(f"{sub}/claim", json={"worker": "obs"})
    if r.status_code == 409:  # no wake yet (NO_PENDING_WORK) or still held
        return
    assert r.status_code == 200, r.text
    lease = r.json()
    acks = [{"stream": s["path"], "offset": s["tail_offset"]} for s in lease["streams"]]
    body = {"wake_id": lease["wake_id"], "generation": lease["generation"], "acks": acks}
    auth = {"authorization": f"Bearer {lease['token']}"}
    assert c.post(f"{sub}/ack", json=body | {"done": True}, headers=auth).status_code == 200


# The test --------------------------------------------------------------------


def test_real_prometheus_scrapes_real_servers(server_factory, tmp_path):
    healthy = server_factory(
        "--long-poll-timeout",
        "1",
        "--sse-reconnect-interval",
        "2",
        "--slow-append-seconds",
        "0",
        "--log-format",
        "json",
        "--retention",  # the retention row's series exist once a policy does
        "logs/:max-bytes=1MiB",
    ).start()
    failing = server_factory(env={"DS_FAULT": "eio:fsync:3"}).start()
    pods = {"ds-0": f"127.0.0.1:{healthy.port}", "ds-1": f"127.0.0.1:{failing.port}"}
    url = setup_streams(healthy)
    quiet = url + "-quiet"
    assert httpx.put(quiet, headers=BIN).status_code == 201

    stop = threading.Event()
    errors: list[Exception] = []

    def appends() -> None:
        with httpx.Client(timeout=10) as c:
            seq = 0
            while not stop.is_set():
                append_loop(c, url, seq)
                seq += 1
                time.sleep(0.02)

    def long_polls() -> None:
        with httpx.Client(timeout=10) as c:
            tail = c.head(quiet).headers["Stream-Next-Offset"]
            while not stop.is_set():
                r = c.get(quiet, params={"offset": tail, "live": "long-poll"})
                assert r.status_code == 204, r.status_code  # nobody writes: times out

    def sse() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                with c.stream("GET", url, params={"offset": "now", "live": "sse"}) as r:
                    assert r.status_code == 200
                    for _ in r.iter_bytes():  # the server ends it every 2 s
                        if stop.is_set():
                            break

    threads = [background(errors, body) for body in (appends, long_polls, sse)]
    prom = None
    try:
        prom = Prometheus(
            tmp_path,
            [(address, {"namespace": "obs", "pod": pod}) for pod, address in pods.items()],
        )

        # 1. Both targets scraped healthy, with their failure counters at 0.
        def scraped() -> list[str]:
            problems = []
            up = {s["metric"]["pod"]: s["value"][1] for s in prom.query('up{namespace="obs"}')}
            if up != {"ds-0": "1", "ds-1": "1"}:
                problems.append(f"up: {up}")
            if not prom.query('durable_streams_batch_failures_total{pod="ds-1"} == 0'):
                problems.append("ds-1 batch failures not scraped at 0 yet")
            if not prom.query('durable_streams_storage_failed{pod="ds-1"} == 0'):
                problems.append("ds-1 not scraped healthy yet")
            return problems

        until_no_problems("targets scraped", scraped, prom, errors)

        # 2. Make ds-1 fail closed: its third WAL flush fails.
        with httpx.Client(timeout=10) as c:
            target = failing.base + "broken"
            assert c.put(target, headers=BIN).status_code == 201
            statuses = [c.post(target, headers=BIN, content=b"x").status_code for _ in range(5)]
        assert 503 in statuses, statuses
        assert statuses[statuses.index(503) :] == [503] * (len(statuses) - statuses.index(503))
        assert httpx.get(f"{failing.url}/readyz").status_code == 503

        give_up = threading.Event()

        def refused_writes() -> None:  # clients go on trying; a rate needs more than one 503
            with httpx.Client(timeout=10) as c:
                while not (stop.is_set() or give_up.is_set()):
                    assert c.post(target, headers=BIN, content=b"x").status_code == 503
                    time.sleep(0.1)

        refusals = background(errors, refused_writes)
        threads.append(refusals)

        # 3. Everything the dashboard and the alerts need is in Prometheus.
        def dashboard_answers() -> list[str]:
            problems = []
            for title, expr in panel_queries():
                values = prom.values(expr)
                finite = [v for v in values if math.isfinite(v)]
                if not values:
                    problems.append(f"empty: {title}: {expr}")
                elif "histogram_quantile" in expr:
                    if not finite:
                        problems.append(f"only NaN: {title}: {expr}")
                elif len(finite) != len(values):
                    problems.append(f"not finite {values}: {title}: {expr}")
            return problems

        until_no_problems("every panel query has data", dashboard_answers, prom, errors)

        def traffic_seen() -> list[str]:
            must_be_positive = [
                f'sum(rate(durable_streams_appends_total{{pod="ds-0"}}[{RATE_INTERVAL}]))',
                f'sum(rate(durable_streams_slow_appends_total{{pod="ds-0"}}[{RATE_INTERVAL}]))',
                f'sum(rate(durable_streams_read_bytes_total{{pod="ds-0"}}[{RATE_INTERVAL}]))',
                f'sum(rate(durable_streams_producer_events_total{{event="duplicate"}}[{RATE_INTERVAL}]))',
                f'sum(rate(durable_streams_http_requests_total{{code="409"}}[{RATE_INTERVAL}]))',
                f'sum(rate(durable_streams_http_requests_total{{code="404"}}[{RATE_INTERVAL}]))',
                'max_over_time(durable_streams_live_readers{pod="ds-0", mode="long-poll"}[30s])',
                'max_over_time(durable_streams_live_readers{pod="ds-0", mode="sse"}[30s])',
                'durable_streams_forks_created_total{pod="ds-0"}',
                'durable_streams_streams_deleted_total{pod="ds-0", reason="deleted"}',
                'durable_streams_streams_deleted_total{pod="ds-0", reason="expired"}',
                'durable_streams_batch_failures_total{pod="ds-1", reason="error"}',
                'durable_streams_http_requests_total{pod="ds-1", code="503"}',
            ]
            return [e for e in must_be_positive if not any(v > 0 for v in prom.values(e))]

        until_no_problems("traffic visible in Prometheus", traffic_seen, prom, errors)

        def alerts_react() -> list[str]:
            got = {
                (
                    a["labels"]["alertname"],
                    a["labels"].get("pod"),
                    a["labels"].get("reason"),
                    a["state"],
                )
                for a in prom.alerts()
            }
            want = {
                ("DurableStreamsStorageFailedClosed", "ds-1", None, "firing"),
                ("DurableStreamsBatchFailures", "ds-1", "error", "firing"),
                ("DurableStreamsNotReady", "ds-1", None, "pending"),
                ("DurableStreamsErrorRate", "ds-1", None, "pending"),
            }
            problems = [f"missing {w}" for w in sorted(want - got)]
            machine_dependent = {
                "DurableStreamsFsyncSlow",
                "DurableStreamsAppendSlow",
                "DurableStreamsDiskNearlyFull",
                "DurableStreamsInodesNearlyFull",
            }
            unexpected = sorted(a for a in got - want if a[0] not in machine_dependent)
            return problems + [f"unexpected {a}" for a in unexpected]

        until_no_problems("alerts on the failed server", alerts_react, prom, errors)

        # 4. Template variables.
        found = {name: prom.label_values(substitute(q, ALL)) for name, q in variables().items()}
        assert found == {
            "namespace": ["obs"],
            "pod": ["ds-0", "ds-1"],
            "instance": sorted(pods.values()),
        }

        # 5. Every panel query answers with the variables set to one pod too, and narrows.
        ds0 = {"namespace": "obs", "pod": "ds-0", "instance": pods["ds-0"]}
        for _title, expr in panel_queries(ds0, rows="all"):
            prom.query(expr)
        by_title = dict(panel_queries(ds0))
        assert prom.values(by_title["Storage failed closed"]) == [0.0]
        assert prom.values(dict(panel_queries())["Storage failed closed"]) == [1.0]
        ready = [e for t, e in panel_queries() if t == "Ready / scraped servers"]
        assert [prom.values(e) for e in ready] == [[1.0], [2.0]]

        # 6. The process row holds the two servers and not Prometheus itself.
        for title in ("Resident memory", "CPU (cores)", "Open file descriptors"):
            series = prom.query(dict(panel_queries())[title])
            seen = sorted(str(s["metric"].get("pod")) for s in series)
            assert seen == ["ds-0", "ds-1"], (title, series)

        # 7. A server that stops answering is seen down (pending: `for: 5m`).
        give_up.set()
        refusals.join(10)
        failing.kill()

        def down() -> list[str]:
            pending = {
                (a["labels"].get("pod"), a["state"])
                for a in prom.alerts()
                if a["labels"]["alertname"] == "DurableStreamsTargetDown"
            }
            return [] if pending == {("ds-1", "pending")} else [f"TargetDown: {pending}"]

        until_no_problems("target down", down, prom, errors)

        # 8. Every alert expression answers; every rule loaded and is healthy.
        for rule in alert_rules():
            prom.query(rule["expr"])
        loaded = [r for g in prom.get("rules")["groups"] for r in g["rules"]]
        assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in alert_rules())
        assert all(r["health"] == "ok" and not r.get("lastError") for r in loaded), loaded
    finally:
        stop.set()
        if prom is not None:
            prom.stop()
        for t in threads:
            t.join(10)
    assert not errors, errors

    # 9. The slow-append log line, as docs/observability.md shows it.
    lines = [json.loads(x) for x in healthy.log_path.read_text().splitlines() if x.startswith("{")]
    slow = [x for x in lines if x.get("event") == "slow_append"]
    assert slow, healthy.log()
    line = slow[0]
    assert line["level"] == "warning" and line["logger"] == "stream_server.protocol"
    assert line["msg"].startswith("slow append to obs/")
    assert line["stream"].startswith("obs/")
    for field in ("seconds", "write_seconds", "fsync_seconds", "commit_seconds"):
        assert isinstance(line[field], float), (field, line)
    assert isinstance(line["batch_appends"], int) and line["batch_appends"] >= 1
