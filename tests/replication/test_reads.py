"""Reads answered as up to date only while the replica knows it is current within
``replication_read_staleness`` (docs/replication.md, "Reads"): real server processes
on the emulated API server, paused with SIGSTOP.

The rule every test checks on every answer it gets: a read answered ``Stream-Up-To-Date:
true`` holds every write acknowledged more than the bound before the read was sent
(``lacking``). And where a replica cannot know that, it refuses with 503:

- the primary paused: its standbys refuse once the bound has passed since it stopped,
  for as long as they know of no newer primary (a long-poll waiting there too), and
  serve again once one exists;
- a standby paused past the bound and thawed: the read that waited for it in its
  socket is not answered from its stale tail (the heartbeats buffered meanwhile
  echo stamps from before the pause: they renew nothing);
- in normal operation, under appends, standbys answer every read (no false 503).

Each runs on single-process servers and on servers of two workers, whose workers serve
a catch-up read themselves while the writer says the replica is current.

Waits are liveness bounds (generous, for 2 shared cores); the times printed are
measurements, not requirements.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testkit.replicaset import ReplicaSet
from testkit.server_process import process_state
from testkit.worker_counts import WORKER_COUNTS
from tests.replication.workload import LIVENESS, OCTET, create_streams, in_sync, until

pytestmark = pytest.mark.processes

STREAM = "reads/0"


@dataclass
class Answer:
    server: str
    sent: float  # the test's clock when the read was sent
    status: int
    up_to_date: bool
    body: bytes
    term: int | None = None  # the server's term, asked right after the read (None: unknown)


def read(client: httpx.Client, rs: ReplicaSet, name: str) -> Answer:
    sent = time.monotonic()
    r = client.get(f"{rs.server(name).base}{STREAM}", params={"offset": "-1"})
    return Answer(
        name, sent, r.status_code, r.headers.get("stream-up-to-date") == "true", r.content
    )


def lacking(answers: list[Answer], acked: dict[bytes, float], bound: float) -> list[str]:
    """Up-to-date answers missing a write acknowledged more than ``bound`` before the
    read was sent (the test saw the acknowledgement, so it happened before that)."""
    bad = []
    for a in answers:
        if a.status != 200 or not a.up_to_date:
            continue
        missing = [m for m, at in acked.items() if at < a.sent - bound and m not in a.body]
        if missing:
            bad.append(f"{a.server} at +{a.sent:.3f}: lacks {len(missing)}, e.g. {missing[0]!r}")
    return bad


def append(rs: ReplicaSet, name: str, body: bytes, acked: dict[bytes, float]) -> None:
    """Append ``body`` at the primary ``name`` until acknowledged; record when."""

    def done() -> bool:
        r = httpx.post(f"{rs.server(name).base}{STREAM}", content=body, headers=OCTET, timeout=30)
        assert r.status_code in (204, 503), (r.status_code, r.text)
        return r.status_code == 204

    until(done, f"{body!r} acknowledged by {name}")
    acked[body] = time.monotonic()


def stopped(rs: ReplicaSet, name: str) -> float:
    """SIGSTOP ``name``; the test's clock once it is stopped (it runs nothing after)."""
    rs.kill(name, signal.SIGSTOP)
    pid = rs.server(name).pid
    until(lambda: process_state(pid) == "T", f"{name} stopped")
    return time.monotonic()


def serving(rs: ReplicaSet, name: str, want: list[bytes]) -> bool:
    """Whether ``name`` answers a read up to date holding every message of ``want``."""
    try:
        with httpx.Client(timeout=5) as client:
            a = read(client, rs, name)
    except httpx.HTTPError:
        return False
    return a.status == 200 and a.up_to_date and all(m in a.body for m in want)


@pytest.fixture
def sets(tmp_path: Path) -> Iterator[list[ReplicaSet]]:
    started: list[ReplicaSet] = []
    yield started
    for rs in started:
        for s in rs.servers:  # a paused server must run again to stop on SIGTERM
            if rs.alive(s.name):
                rs.kill(s.name, signal.SIGCONT)
        rs.down()


# Leases short enough for a failover within seconds, with room between the bound
# (1.5 s) and the earliest a standby may take the Lease (4 s after the primary's last
# renewal it saw, 0.3 s at most before the pause); the heartbeat is 0.5 s.
PAUSED_PRIMARY = {
    "lease_duration": "4",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.3",
    "replication_wait": "10",
    "replication_read_staleness": "1.5",
}


# Each server one process, or a writer and two workers, whose workers serve a catch-up
# read themselves while the writer says the replica is current (workers/worker_app.py).
@WORKER_COUNTS
def test_standbys_refuse_reads_once_the_primary_is_paused_past_the_bound(sets, tmp_path, workers):
    bound = float(PAUSED_PRIMARY["replication_read_staleness"])
    rs = ReplicaSet.up(3, tmp_path / "rs", settings=PAUSED_PRIMARY, args=("--workers", workers))
    sets.append(rs)
    create_streams(rs, [STREAM])
    old = in_sync(rs, 2)
    term = (rs.status(old) or {})["term"]
    standbys = [s.name for s in rs.servers if s.name != old]
    acked: dict[bytes, float] = {}
    for i in range(5):
        append(rs, old, f"before.{i};".encode(), acked)
    for name in standbys:
        until(lambda name=name: serving(rs, name, list(acked)), f"{name} serving the appends")

    # A long-poll waiting at the tail of a standby (its timeout: 30 s).
    tail = httpx.head(f"{rs.server(standbys[0]).base}{STREAM}").headers["stream-next-offset"]
    polled: list[httpx.Response] = []
    poll = threading.Thread(
        target=lambda: polled.append(
            httpx.get(
                f"{rs.server(standbys[0]).base}{STREAM}",
                params={"offset": tail, "live": "long-poll"},
                timeout=LIVENESS,
            )
        )
    )
    poll.start()
    paused_at = stopped(rs, old)
    answers: list[Answer] = []
    refused_at: dict[str, float] = {}
    with httpx.Client(timeout=10) as client:
        deadline = time.monotonic() + LIVENESS
        while len(refused_at) < len(standbys):
            assert time.monotonic() < deadline, f"standbys never refused: {rs.statuses()}"
            for name in standbys:
                a = read(client, rs, name)
                a.term = (rs.status(name) or {}).get("term")
                answers.append(a)
                if a.status == 503 and a.term == term:
                    refused_at.setdefault(name, a.sent - paused_at)
            if any(a.term not in (None, term) for a in answers[-len(standbys) :]):
                break  # a newer term is known: the window to refuse in has passed
    # While a standby knew of no newer primary, nothing it said up to date was asked for
    # more than the bound after the pause: no echo can be newer than the pause.
    late = [
        f"{a.server} at +{a.sent - paused_at:.3f}s: {a.status}"
        for a in answers
        if a.term == term and a.sent > paused_at + bound + 0.01 and a.status != 503
    ]
    assert not late, f"answered past the bound ({len(late)} times): {late[:10]}"
    assert set(refused_at) == set(standbys), (
        f"a standby never refused before a new term: {refused_at}; {rs.statuses()}"
    )
    poll.join(LIVENESS)
    assert polled and polled[0].status_code == 503, polled and polled[0].headers
    print(
        f"\nprimary paused: standbys refused reads after "
        f"{', '.join(f'{n} {t:.2f} s' for n, t in sorted(refused_at.items()))} "
        f"(bound {bound:g} s)"
    )

    new = rs.primary(timeout=LIVENESS, exclude=(old,)).name
    elected = time.monotonic() - paused_at
    append(rs, new, b"after.0;", acked)
    for name in standbys:
        until(lambda name=name: serving(rs, name, list(acked)), f"{name} serving again")
    print(
        f"a new primary {new} after {elected:.2f} s; every remaining replica serving again "
        f"after {time.monotonic() - paused_at:.2f} s"
    )
    # The deposed primary, thawed, is not current (it may no longer acknowledge): until
    # it follows the new primary its reads are refused, never answered stale.
    rs.kill(old, signal.SIGCONT)
    with httpx.Client(timeout=10) as client:
        thawed = read(client, rs, old)
    assert thawed.status == 503 or not lacking([thawed], acked, bound), thawed
    assert not lacking(answers, acked, bound)
    until(lambda: serving(rs, old, list(acked)), f"{old} serving again as a standby")


# The primary stays (a long lease); the heartbeat is 1 s, the bound 3 s.
PAUSED_STANDBY = {
    "lease_duration": "15",
    "lease_renew_deadline": "10",
    "lease_retry_period": "0.3",
    "replication_wait": "10",
    "replication_read_staleness": "3",
}


@WORKER_COUNTS
def test_a_standby_paused_past_the_bound_does_not_answer_from_its_stale_tail(
    sets, tmp_path, workers
):
    bound = float(PAUSED_STANDBY["replication_read_staleness"])
    rs = ReplicaSet.up(3, tmp_path / "rs", settings=PAUSED_STANDBY, args=("--workers", workers))
    sets.append(rs)
    create_streams(rs, [STREAM])
    primary = in_sync(rs, 2)
    sleeper = next(s.name for s in rs.servers if s.name != primary)
    acked: dict[bytes, float] = {}
    append(rs, primary, b"before;", acked)
    until(lambda: serving(rs, sleeper, list(acked)), f"{sleeper} serving the append")

    paused_at = stopped(rs, sleeper)
    # Acknowledged without it once the primary dropped it from the in-sync set.
    for i in range(5):
        append(rs, primary, f"missed.{i};".encode(), acked)
    # The scenario: asleep for longer than the bound, after the last of those writes.
    time.sleep(max(0.0, max(acked.values()) + bound + 0.5 - time.monotonic()))
    # A read that waits in its socket while it sleeps: the first thing it answers.
    host, port = "127.0.0.1", rs.server(sleeper).port
    with socket.create_connection((host, port), timeout=30) as sock:
        request = f"GET /v1/stream/{STREAM}?offset=-1 HTTP/1.1\r\nhost: {host}\r\n"
        sock.sendall((request + "connection: close\r\n\r\n").encode())
        sent = time.monotonic()
        rs.kill(sleeper, signal.SIGCONT)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    first = Answer(sleeper, sent, status, fields.get("stream-up-to-date") == "true", body)
    print(
        f"\nstandby paused {sent - paused_at:.2f} s (bound {bound:g} s): its first read "
        f"answered {status}"
    )
    assert not lacking([first], acked, bound), (
        f"answered up to date from its tail of before the pause: {status} {body[:200]!r}"
    )
    assert status in (200, 503), (status, body[:200])
    if status == 503:
        assert fields["retry-after"] == "1"
        assert fields["stream-primary"].rstrip("/") == rs.server(primary).url
    until(lambda: serving(rs, sleeper, list(acked)), f"{sleeper} current and serving again")
    print(f"serving again {time.monotonic() - sent:.2f} s after it was thawed")


# Heartbeats every 0.5 s, the bound four of them: a renewal that did not work would
# show as 503s within the run.
STEADY_READS = {
    "lease_duration": "3",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.3",
    "replication_wait": "10",
    "replication_read_staleness": "2",
}
IDLE = 2.0  # seconds of reads before the appends begin: the heartbeats alone renew
RUN = 8.0  # seconds of reads in all: four times the bound


@WORKER_COUNTS
def test_standbys_answer_every_read_while_the_set_is_healthy(sets, tmp_path, workers):
    bound = float(STEADY_READS["replication_read_staleness"])
    rs = ReplicaSet.up(3, tmp_path / "rs", settings=STEADY_READS, args=("--workers", workers))
    sets.append(rs)
    create_streams(rs, [STREAM])
    primary = in_sync(rs, 2)
    standbys = [s.name for s in rs.servers if s.name != primary]
    for name in standbys:
        until(
            lambda name=name: (rs.status(name) or {}).get("fresh_for", 0) > 0,
            f"{name} current",
        )
    acked: dict[bytes, float] = {}
    answers: list[Answer] = []
    # How long ago a standby was last known current, when asked: idle, and under appends.
    ages: dict[str, list[float]] = {"idle": [], "appending": []}
    terms: set[str | None] = set()  # the terms the acknowledgements named

    async def run() -> None:
        appending = time.monotonic() + IDLE
        stop = time.monotonic() + RUN
        async with httpx.AsyncClient(timeout=30) as client:

            async def writer() -> None:
                await asyncio.sleep(IDLE)  # the scenario: an idle set first
                i = 0
                while time.monotonic() < stop:
                    body = f"w.{i};".encode()
                    r = await client.post(
                        f"{rs.server(primary).base}{STREAM}", content=body, headers=OCTET
                    )
                    assert r.status_code == 204, (r.status_code, r.text)
                    acked[body] = time.monotonic()
                    terms.add(r.headers.get("replication-term"))
                    i += 1

            async def reader(name: str) -> None:
                while time.monotonic() < stop:
                    sent = time.monotonic()
                    r = await client.get(f"{rs.server(name).base}{STREAM}", params={"offset": "-1"})
                    up = r.headers.get("stream-up-to-date") == "true"
                    answers.append(Answer(name, sent, r.status_code, up, r.content))
                    await asyncio.sleep(0.02)

            async def sampler(name: str) -> None:
                while time.monotonic() < stop:
                    r = await client.get(f"{rs.server(name).url}/replication")
                    phase = "idle" if time.monotonic() < appending else "appending"
                    ages[phase].append(bound - r.json()["fresh_for"])
                    await asyncio.sleep(0.05)

            await asyncio.gather(
                writer(), *(reader(n) for n in standbys), *(sampler(n) for n in standbys)
            )

    asyncio.run(run())
    refused = [f"{a.server} {a.status} {a.body[:120]!r}" for a in answers if a.status != 200]
    seen = {
        phase: f"{sorted(a)[len(a) // 2]:.2f} s (median of {len(a)}), {max(a):.2f} s at most"
        for phase, a in ages.items()
        if a
    }
    print(
        f"\n{len(acked)} appends, {len(answers)} reads on the standbys, {len(refused)} refused; "
        f"a standby was last known current, idle: {seen.get('idle')}; under appends: "
        f"{seen.get('appending')} (bound {bound:g} s, heartbeat 0.5 s)"
    )
    assert len(acked) > 10 and answers
    assert terms == {str((rs.status(primary) or {}).get("term"))}  # through a worker too
    assert not refused, refused[:5]
    assert not lacking(answers, acked, bound)
