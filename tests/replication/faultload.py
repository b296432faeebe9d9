"""What the fault tests (issue 24, ``test_faults_*.py``) share: the sets they start
(on loopback, with an API proxy per server, or each server in a network namespace),
the monitor that records every server's role and term into the history, the
verdict with the staleness bound, and the line of figures each test prints.

The workload is ``workload.py``'s (writers, idempotent producers, readers on every
replica). A run's verdict: every acknowledged append present exactly once and in
order on every replica (they must converge to the same bytes), no acknowledgement
from a replica after another was seen primary at a higher term, no read that said
up to date yet missed a write acknowledged more than ``BOUND`` seconds before it.

FAULT_ROUNDS (default 1) repeats each test's fault; ``make test-long`` sets more.
FAULT_STALENESS_BOUND (default 5, the server's ``replication_read_staleness``)
is the bound the reads are held to.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from testkit import needs, summary
from testkit.faults.net import API, Net
from testkit.faults.proxy import ApiProxy
from testkit.history import History, Report, check
from testkit.replicaset import Launch, ReplicaSet
from tests.replication.workload import Workload, load_until

ROUNDS = int(os.environ.get("FAULT_ROUNDS", "1"))
SUMMARY = "replica-set faults (issue 24)"  # the end-of-run figures' section
BOUND = float(os.environ.get("FAULT_STALENESS_BOUND", "5"))
# Short leases so that a failover takes seconds, as the failover tests have them.
FAST = {
    "lease_duration": "3",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.5",
    "replication_wait": "2",
}
ARGS = ("--long-poll-timeout", "2")
MONITOR_EVERY = 0.1  # seconds between two GET /replication to one server
# Seconds a fault test waits for a new primary: a failover takes about lease_duration
# plus a retry period; this is a liveness bound for a loaded 2-core machine, not a speed.
FAILOVER_PATIENCE = 60.0


# What the namespace tests need: Debian's ip and iptables, and root (as make test and CI
# run), for network namespaces and their rules.
NAMESPACES = [
    needs.commands("ip", "iptables", install="Debian's iproute2 and iptables (make system-deps)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]


# -- sets ---------------------------------------------------------------------------------


@contextlib.contextmanager
def loopback_set(
    tmp_path: Path,
    settings: dict[str, str] | None = None,
    *,
    n: int = 3,
    proxies: bool = False,
    env: Callable[[str], dict[str, str]] = lambda name: {},
) -> Iterator[tuple[ReplicaSet, dict[str, ApiProxy]]]:
    """A set on loopback; with ``proxies``, each server reaches the API through an
    ``ApiProxy`` of its own (by name). ``env(name)``: more environment for a server."""
    made: dict[str, ApiProxy] = {}

    def launch(name: str, api: str) -> Launch:
        extra = dict(env(name)) if api else {}
        if api and proxies:
            made[name] = ApiProxy(api, name).start()
            extra["DS_KUBE_API"] = made[name].url
        return Launch(env=extra)

    rs: ReplicaSet | None = None
    try:
        rs = ReplicaSet.up(n, tmp_path / "rs", settings=settings or FAST, args=ARGS, launch=launch)
        yield rs, made
    finally:
        if rs is not None:
            rs.down(grace=5)
        for proxy in made.values():
            proxy.close()


@contextlib.contextmanager
def namespaced_set(
    tmp_path: Path, settings: dict[str, str] | None = None, *, n: int = 3
) -> Iterator[tuple[ReplicaSet, Net]]:
    """A set whose servers each run in a network namespace of their own (``Net``), the
    API server in the hub namespace; the test's clients reach them all."""
    with Net() as net:
        rs: ReplicaSet | None = None

        def launch(name: str, api: str) -> Launch:
            if not api:
                return Launch(host=net.addresses[API], prefix=net.prefix("hub"))
            return Launch(host=net.add(name), prefix=net.prefix(name))

        try:
            rs = ReplicaSet.up(
                n, tmp_path / "rs", settings=settings or FAST, args=ARGS, launch=launch
            )
            yield rs, net
        finally:
            net.heal()  # a server that cannot reach its peers still stops at once
            if rs is not None:
                rs.down(grace=5)


# -- the monitor --------------------------------------------------------------------------


@contextlib.contextmanager
def monitor(rs: ReplicaSet, history: History) -> Iterator[None]:
    """Poll every server's ``GET /replication`` (one thread each, so that a paused or
    cut server delays nobody else's), recording role and term into ``history``."""
    stop = threading.Event()

    def watch(url: str, name: str) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    body = client.get(f"{url}/replication").json()
                    history.observe(name, sent, body.get("role"), body.get("term"))
                except (httpx.HTTPError, ValueError):
                    history.observe(name, sent, None, None)
                stop.wait(MONITOR_EVERY)

    threads = [
        threading.Thread(target=watch, args=(s.url, s.name), daemon=True) for s in rs.servers
    ]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(5)


def elect(rs: ReplicaSet, old: str, since: float) -> float:
    """Wait until a server other than ``old`` is the one primary (``old`` not asked: it
    may be cut off or paused); seconds since ``since``."""
    try:
        rs.primary(timeout=FAILOVER_PATIENCE, exclude=(old,))
    except RuntimeError as exc:
        raise AssertionError(f"the set did not fail over from {old}: {exc}") from None
    return time.monotonic() - since


def new_primary_after(history: History, since: float, old: str) -> float | None:
    """Seconds from ``since`` until another server than ``old`` was first seen primary
    (at a higher term than ``old`` was), or None."""
    old_terms = [s.term or 0 for s in history.seen if s.server == old and s.role == "primary"]
    times = [
        s.received
        for s in history.seen
        if s.server != old
        and s.role == "primary"
        and (s.term or 0) > max(old_terms, default=0)
        and s.received > since
    ]
    return min(times) - since if times else None


def first_ack_after(history: History, since: float) -> float | None:
    """Seconds from ``since`` until the first acknowledgement received after it, or None."""
    done = [
        op.completed
        for op in history.ops
        if op.kind == "append" and op.outcome == "ok" and op.completed and op.completed > since
    ]
    return min(done) - since if done else None


def claimed_primary_after(history: History, old: str, term: int) -> float:
    """How long ``old``, primary at ``term``, still said it was primary in answers to
    requests sent after another server had been seen primary at a higher term (0: never,
    or no other primary was seen)."""
    newer = [
        s.received
        for s in history.seen
        if s.server != old and s.role == "primary" and (s.term or 0) > term
    ]
    if not newer:
        return 0.0
    first = min(newer)
    late = [
        s.sent - first
        for s in history.seen
        if s.server == old and s.role == "primary" and s.term == term and s.sent > first
    ]
    return max(late, default=0.0)


# -- the run and its verdict --------------------------------------------------------------


def under_load(work: Workload, fault: Callable[[], None], refused: list[str]) -> bool:
    """``load_until(work, fault)``; a client's refused append (a 4xx, such as a producer's
    sequence gap once its acknowledged appends were lost) goes into ``refused`` for the
    verdict instead of ending the test before it. False when one was refused."""
    try:
        asyncio.run(load_until(work, fault))
    except AssertionError as exc:
        if "append refused" not in str(exc):
            raise
        refused.append(str(exc))
        return False
    return True


def verdict(
    name: str,
    history: History,
    final: dict[str, bytes],
    tmp_path: Path,
    *,
    bound: float = BOUND,
    failover: float | None = None,
    refused: list[str] | None = None,
) -> Report:
    """Check the history; print the figures line, then fail on any problem (``refused``:
    appends a client had refused, from ``under_load``)."""
    report = check(history, final, bound=bound)
    history.dump(tmp_path / "history.jsonl")
    over = "-" if failover is None else f"{failover:.2f} s"
    figures = (
        f"{name}: acknowledged appends {report.acknowledged}, lost "
        f"{len(report.lost)}, longest write pause {report.pause:.2f} s, longest staleness "
        f"{report.staleness:.2f} s (bound {bound:g} s), failover {over}; "
        f"{report.fresh_reads} up-to-date reads"
    )
    print(f"\nfigures {figures}")
    summary.report(SUMMARY, figures)
    print(f"history: {report.summary()}")
    where = f"(history in {tmp_path / 'history.jsonl'})"
    assert report.ok, f"{report.summary()} {where}"
    assert not refused, f"a client's append was refused: {refused}; {report.summary()} {where}"
    assert report.acknowledged > 0
    return report
