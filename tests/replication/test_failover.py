"""Failover end to end: real server processes, a real (emulated) Kubernetes API, kill -9.

Three servers form a replica set (``testkit.replicaset``). Clients append
to a few streams while the test kills servers: plain writers (a new message
per attempt, since they cannot say they are retrying) and idempotent
producers (``Producer-Id/Epoch/Seq``, resending the same message until it is
acknowledged). Clients find the primary as a real client would: they follow
``Stream-Primary`` on a 503 and try the next server when one does not answer.
Readers read every stream from the start on any server, standbys included.

Every invocation and result goes into a ``testkit.history.History``; once the
set has converged, every replica must hold byte-identical streams and the
checker must find nothing: every acknowledged append present exactly once and
in its client's order, nothing refused present, no read that returned data
later missing.

The waits below are liveness bounds (generous, for 2 shared cores), never
speed requirements: the failover time is printed, not asserted. Rounds:
FAILOVER_ROUNDS (default 1) primaries killed one after the other.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from conftest import read_served
from testkit import wait_for
from testkit.history import History, check, message
from testkit.replicaset import ReplicaSet

ROUNDS = int(os.environ.get("FAILOVER_ROUNDS", "1"))
STREAMS = 3
# Short leases so that a failover takes seconds; replication_wait short so that a write
# with too few replicas in sync is refused soon. Liveness bounds below are far above these.
FAST = {
    "lease_duration": "3",
    "lease_renew_deadline": "2",
    "lease_retry_period": "0.5",
    "replication_wait": "2",
}
LIVENESS = 90.0  # seconds: the most any awaited state change may take before the test fails
AFTER_EVENT = 10  # appends each writer must get acknowledged after a kill, before it stops
OCTET = {"Content-Type": "application/octet-stream"}
T = TypeVar("T")


@pytest.fixture
def replica_set(tmp_path: Path) -> Iterator[ReplicaSet]:
    rs = ReplicaSet.up(3, tmp_path / "rs", settings=FAST, args=("--long-poll-timeout", "2"))
    try:
        yield rs
    finally:
        rs.down()


# -- clients --------------------------------------------------------------------------------


class Router:
    """Where a client sends its next write: the primary as it last learnt it."""

    def __init__(self, rs: ReplicaSet) -> None:
        self.urls = [s.url for s in rs.servers]
        self.target = random.choice(self.urls)

    def moved(self, response: httpx.Response | None) -> None:
        """After a failed attempt: follow ``Stream-Primary``, else try the next server."""
        primary = response.headers.get("stream-primary") if response is not None else None
        if primary:
            self.target = primary.rstrip("/")
        else:
            self.target = self.urls[(self.urls.index(self.target) + 1) % len(self.urls)]


def name_of(rs: ReplicaSet, url: str) -> str:
    return next((s.name for s in rs.servers if s.url == url), url)


@dataclass
class Workload:
    """Writers, producers and readers over ``STREAMS`` streams, recording into ``history``."""

    rs: ReplicaSet
    history: History
    streams: list[str]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    next_seq: dict[str, int] = field(default_factory=dict)  # producer -> next Producer-Seq
    attempts: itertools.count = field(default_factory=itertools.count)

    def acked_since(self, since: float, process: str | None = None) -> int:
        return sum(
            1
            for op in self.history.ops
            if op.kind == "append"
            and op.outcome == "ok"
            and (op.completed or 0) > since
            and (process is None or op.process == process)
        )

    def writers(self) -> list[str]:
        return [f"{kind}{i}" for i in range(len(self.streams)) for kind in ("w", "p")]

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:
            tasks = []
            for i, stream in enumerate(self.streams):
                tasks.append(self._plain(client, f"w{i}", stream))
                tasks.append(self._producer(client, f"p{i}", stream))
                tasks.append(self._reader(client, f"r{i}", stream))
            await asyncio.gather(*tasks)

    async def _append(
        self,
        client: httpx.AsyncClient,
        router: Router,
        process: str,
        stream: str,
        token: str,
        headers: dict[str, str],
    ) -> bool:
        """One attempt; True when acknowledged."""
        op = self.history.invoke(
            process, "append", stream, token=token, server=name_of(self.rs, router.target)
        )
        body = message(token, random.randint(0, 200))
        try:
            r = await client.post(
                f"{router.target}/v1/stream/{stream}", content=body, headers=headers
            )
        except httpx.ConnectError as exc:  # nothing was sent: certainly not applied
            self.history.complete(op, "fail", type(exc).__name__)
            router.moved(None)
            await asyncio.sleep(0.05)
            return False
        except httpx.HTTPError as exc:  # sent, and the answer lost: unknown
            self.history.complete(op, "info", type(exc).__name__)
            router.moved(None)
            await asyncio.sleep(0.05)
            return False
        if r.status_code in (200, 204):
            self.history.complete(op, "ok", str(r.status_code))
            return True
        if 400 <= r.status_code < 500:
            self.history.complete(op, "fail", f"{r.status_code} {r.text[:200]}")
            raise AssertionError(f"{process}: append refused {r.status_code}: {r.text[:300]}")
        primary = (r.headers.get("stream-primary") or "").rstrip("/")
        if r.status_code == 503 and primary and primary != router.target:
            # A standby's refusal: the design says it is never applied there, so if it
            # shows up in a stream the checker reports it.
            self.history.complete(op, "fail", f"503 from a standby, primary {primary}")
        else:  # e.g. a primary without enough replicas in sync: durable on it, maybe later
            self.history.complete(op, "info", str(r.status_code))
        router.moved(r)
        await asyncio.sleep(0.05)
        return False

    async def _plain(self, client: httpx.AsyncClient, process: str, stream: str) -> None:
        router = Router(self.rs)
        while not self.stop.is_set():
            token = f"{process}.{next(self.attempts)}"  # a new message per attempt
            await self._append(client, router, process, stream, token, OCTET)

    async def _producer(self, client: httpx.AsyncClient, process: str, stream: str) -> None:
        router = Router(self.rs)
        while not self.stop.is_set():
            seq = self.next_seq.setdefault(process, 0)
            headers = OCTET | {
                "Producer-Id": process,
                "Producer-Epoch": "0",
                "Producer-Seq": str(seq),
            }
            # The same token until acknowledged: a retry must never land twice.
            while not await self._append(
                client, router, process, stream, f"{process}.{seq}", headers
            ):
                if self.stop.is_set():
                    return  # its outcome stays unknown; the next run resends it
            self.next_seq[process] = seq + 1

    async def _reader(self, client: httpx.AsyncClient, process: str, stream: str) -> None:
        while not self.stop.is_set():
            server = random.choice(self.rs.servers)
            op = self.history.invoke(process, "read", stream, server=server.name)
            try:
                content = await read_from(client, server.url, stream)
            except httpx.HTTPError as exc:
                self.history.complete(op, "info", type(exc).__name__)
            else:
                if content is None:
                    self.history.complete(op, "info", "not served")
                else:
                    self.history.complete(op, "ok", "200", content)
            await asyncio.sleep(0.05)


async def read_from(client: httpx.AsyncClient, origin: str, stream: str) -> bytes | None:
    """A stream's whole content on one server, or None when that server does not serve it:
    ``conftest.read_served`` for the history checker's concurrent readers, which need an
    async client."""
    out, offset = b"", "-1"
    while True:
        r = await client.get(f"{origin}/v1/stream/{stream}", params={"offset": offset})
        if r.status_code != 200:
            return None
        out += r.content
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out


# -- the set's state ------------------------------------------------------------------------


def until(
    what: Callable[[], T | None], message: str | Callable[[], str], timeout: float = LIVENESS
) -> T:
    """``wait_for`` with this file's patience: a failover may take a while to settle."""
    return wait_for(what, timeout=timeout, message=message)


def in_sync(rs: ReplicaSet, standbys: int) -> str:
    """Wait until the primary counts ``standbys`` standbys in sync; its name."""

    def ready() -> str | None:
        primary = rs.primary(timeout=LIVENESS)
        st = rs.status(primary.name) or {}
        return primary.name if len(st.get("in_sync") or []) >= standbys else None

    return until(ready, lambda: f"{standbys} standbys in sync: {rs.statuses()}")


def create_streams(rs: ReplicaSet, names: list[str]) -> None:
    """Create each stream on the primary (retrying while the set forms)."""
    for name in names:

        def created(name: str = name) -> bool:
            primary = rs.primary(timeout=LIVENESS)
            r = httpx.put(f"{primary.base}{name}", headers=OCTET, timeout=10)
            assert r.status_code in (200, 201, 503), r.text
            return r.status_code in (200, 201)

        until(created, lambda name=name: f"stream {name} created: {rs.statuses()}")


def converged(
    rs: ReplicaSet, streams: list[str], names: list[str] | None = None
) -> dict[str, bytes]:
    """Wait until every named replica (default: all) serves the same bytes; return them."""

    def contents() -> list[dict[str, bytes | None]]:
        with httpx.Client(timeout=10) as client:
            out = []
            for s in rs.servers:
                if names is not None and s.name not in names:
                    continue
                got: dict[str, bytes | None] = {}
                for stream in streams:
                    try:
                        got[stream] = read_served(client, f"{s.url}/v1/stream/{stream}")
                    except httpx.HTTPError:
                        got[stream] = None
                out.append(got)
            return out

    last: list[dict[str, bytes | None]] = []

    def same() -> dict[str, bytes] | None:
        nonlocal last
        last = contents()
        first = last[0]
        if any(v is None for v in first.values()) or any(other != first for other in last[1:]):
            return None
        return {k: v for k, v in first.items() if v is not None}

    try:
        return until(same, "every replica holding the same bytes")
    except AssertionError:
        sizes = [{k: None if v is None else len(v) for k, v in c.items()} for c in last]
        raise AssertionError(f"replicas never converged: sizes {sizes}; {rs.statuses()}") from None


def verdict(history: History, final: dict[str, bytes], tmp_path: Path) -> None:
    report = check(history, final)
    history.dump(tmp_path / "history.jsonl")
    print(f"\nhistory: {report.summary()}")
    assert report.ok, f"{report.summary()} (history in {tmp_path / 'history.jsonl'})"
    assert report.acknowledged > 0


async def load_until(work: Workload, event, *, after: int = AFTER_EVENT) -> float:
    """Run the workload, do ``event()`` once some appends are acknowledged, and go on until
    every writer has ``after`` more acknowledged; return when ``event`` happened."""
    work.stop = asyncio.Event()  # a workload runs again in the next round, where it left off
    runner = asyncio.create_task(work.run())
    try:
        await asyncio.to_thread(
            until, lambda: work.acked_since(0) >= 20 or runner.done(), "first appends"
        )
        at = time.monotonic()
        await asyncio.to_thread(event)
        for process in work.writers():
            await asyncio.to_thread(
                until,
                lambda p=process: work.acked_since(at, p) >= after or runner.done(),
                f"{process}: {after} appends acknowledged after the event",
            )
    finally:
        work.stop.set()
        await runner  # raises what a client raised
    return at


# -- the tests ------------------------------------------------------------------------------


def test_kill9_of_the_primary_under_load_loses_nothing_acknowledged(replica_set, tmp_path):
    rs = replica_set
    streams = [f"failover/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    history = History()
    failovers: list[tuple[float, float]] = []
    work = Workload(rs, history, streams)
    for _ in range(ROUNDS):
        old = in_sync(rs, 2)
        elected: dict[str, float] = {}

        def kill_primary(old: str = old, elected: dict[str, float] = elected) -> None:
            elected["killed"] = time.monotonic()
            rs.kill(old, signal.SIGKILL)
            new = rs.primary(timeout=LIVENESS, exclude=(old,))
            elected["seconds"] = time.monotonic() - elected["killed"]
            assert new.name != old

        asyncio.run(load_until(work, kill_primary))
        # The first write the new primary acknowledged: what a client waited, at best.
        first_ack = min(
            op.completed
            for op in history.ops
            if op.kind == "append"
            and op.outcome == "ok"
            and op.server != old
            and op.completed
            and op.completed > elected["killed"]
        )
        failovers.append((elected["seconds"], first_ack - elected["killed"]))
        rs.restart(old)  # it rejoins as a standby and drops its unacknowledged tail
        final = converged(rs, streams)
    verdict(history, final, tmp_path)
    for i, (elected_s, ack_s) in enumerate(failovers):
        print(
            f"failover {i + 1}: new primary after {elected_s:.2f} s, first acknowledged "
            f"append after {ack_s:.2f} s (lease_duration {FAST['lease_duration']} s)"
        )


def test_too_few_standbys_in_sync_gets_503_not_an_acknowledgement(replica_set, tmp_path):
    rs = replica_set
    streams = ["quorum/0"]
    create_streams(rs, streams)
    primary = in_sync(rs, 2)
    history = History()
    url = f"{rs.server(primary).base}{streams[0]}"

    def append(token: str) -> httpx.Response:
        op = history.invoke("w0", "append", streams[0], token=token, server=primary)
        r = httpx.post(url, content=message(token), headers=OCTET, timeout=30)
        outcome = (
            "ok" if r.status_code in (200, 204) else "info" if r.status_code >= 500 else "fail"
        )
        history.complete(op, outcome, str(r.status_code))
        return r

    assert append("w0.0").status_code == 204
    standbys = [s.name for s in rs.servers if s.name != primary]
    for name in standbys:
        rs.kill(name, signal.SIGKILL)
    refused = append("w0.1")
    assert refused.status_code == 503, refused.text  # 1 of 3 is fewer than a majority
    assert refused.headers.get("retry-after")
    assert rs.status(primary)["role"] == "primary"
    for name in standbys:
        rs.restart(name)
    in_sync(rs, 2)
    assert append("w0.2").status_code == 204
    verdict(history, converged(rs, streams), tmp_path)


def test_kill9_of_a_standby_under_load_then_it_catches_up(replica_set, tmp_path):
    rs = replica_set
    streams = [f"standby/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    primary = in_sync(rs, 2)
    victim = next(s.name for s in rs.servers if s.name != primary)
    history = History()
    work = Workload(rs, history, streams)
    # 2 of 3 remain: writes go on once the primary has dropped the dead standby from the ISR.
    asyncio.run(load_until(work, lambda: rs.kill(victim, signal.SIGKILL)))
    assert rs.primary(timeout=LIVENESS).name == primary  # a standby's death moves nothing
    rs.restart(victim)
    in_sync(rs, 2)  # caught up and back in the ISR
    verdict(history, converged(rs, streams), tmp_path)


def test_all_killed_and_restarted_together_keeps_every_acknowledged_append(replica_set, tmp_path):
    rs = replica_set
    streams = [f"coldstart/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    in_sync(rs, 2)
    history = History()

    def kill_all() -> None:
        for s in rs.servers:
            rs.kill(s.name, signal.SIGKILL)
        for s in rs.servers:
            rs.restart(s.name)

    work = Workload(rs, history, streams)
    asyncio.run(load_until(work, kill_all))
    in_sync(rs, 2)
    verdict(history, converged(rs, streams), tmp_path)


def recopies_of(rs: ReplicaSet, name: str) -> int:
    """How often a server re-copied itself from a primary (its log says so each time)."""
    return Path(rs.server(name).log).read_text(errors="replace").count("re-copying everything")


def test_a_standby_behind_at_a_cold_start_catches_up_by_frames_not_a_recopy(replica_set):
    """A standby left out of the in-sync set (paused) misses some appends; then all
    three are killed and restarted. The new primary's frames were only in its WAL,
    which recovery replays and retires: it must still ship them (engine/replica.py,
    ``replayed``), so the standby catches up without re-copying everything."""
    rs = replica_set
    stream = "behind/0"
    create_streams(rs, [stream])
    primary = in_sync(rs, 2)
    lagger = next(s.name for s in rs.servers if s.name != primary)
    recopies = recopies_of(rs, lagger)
    rs.kill(lagger, signal.SIGSTOP)
    until(
        lambda: lagger not in (rs.status(primary) or {}).get("in_sync", [lagger]),
        lambda: f"{lagger} out of the in-sync set: {rs.statuses()}",
    )
    url = f"{rs.server(primary).base}{stream}"
    sent = [message(f"missed.{i}") for i in range(5)]
    for body in sent:
        r = httpx.post(url, content=body, headers=OCTET, timeout=30)
        assert r.status_code == 204, r.text
    for s in rs.servers:
        rs.kill(s.name, signal.SIGKILL)
    for s in rs.servers:
        rs.restart(s.name)
    in_sync(rs, 2)
    final = converged(rs, [stream])
    assert final[stream].endswith(b"".join(sent))
    assert recopies_of(rs, lagger) == recopies


def test_a_paused_primary_acknowledges_nothing_more_and_rejoins(replica_set, tmp_path):
    """SIGSTOP past the Lease while writes go on at a new primary, then SIGCONT."""
    rs = replica_set
    streams = [f"paused/{i}" for i in range(STREAMS)]
    create_streams(rs, streams)
    old = in_sync(rs, 2)
    history = History()

    stopped: list[float] = []

    def pause() -> None:
        rs.kill(old, signal.SIGSTOP)
        stopped.append(time.monotonic())  # it runs nothing from here until SIGCONT
        rs.primary(timeout=LIVENESS, exclude=(old,))

    work = Workload(rs, history, streams)
    asyncio.run(load_until(work, pause))
    rs.kill(old, signal.SIGCONT)
    # Thawed, it must not take a write: it lost the Lease while it slept.
    r = httpx.post(
        f"{rs.server(old).base}{streams[0]}", content=message("late.0"), headers=OCTET, timeout=30
    )
    assert r.status_code == 503, (r.status_code, r.text)
    until(lambda: (rs.status(old) or {}).get("role") == "standby", f"{old} back as a standby")
    late = [
        op.token
        for op in history.ops
        if op.kind == "append"
        and op.server == old
        and op.outcome == "ok"
        and op.invoked > stopped[0]
    ]
    assert not late, f"{old} acknowledged writes sent after it was paused: {late[:10]}"
    in_sync(rs, 2)
    verdict(history, converged(rs, streams), tmp_path)
