"""The replica-set workload the failover and switchover tests share: clients that
write, produce and read as real ones would, recording into a ``History``, and the
waits for the set's state. Real server processes (``testkit.replicaset``), real HTTP.

Clients find the primary as a real client would: they follow ``Stream-Primary``
on a 503 and try the next server when one does not answer. Plain writers send a
new message per attempt (they cannot say they are retrying); idempotent
producers (``Producer-Id/Epoch/Seq``) resend the same message until it is
acknowledged. Readers read every stream from the start on any server, standbys
included, and note when the request whose answer said ``Stream-Up-To-Date``
was sent (the staleness check of ``testkit.history``). An acknowledgement
whose answer names its term (``Replication-Term``) records it. The waits are
liveness bounds (generous, for 2 shared cores), never speed requirements.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from testkit import wait_for
from testkit.history import History, check, message
from testkit.replicaset import ReplicaSet
from testkit.stream_reads import read_served

LIVENESS = 90.0  # seconds: the most any awaited state change may take before the test fails
AFTER_EVENT = 10  # appends each writer must get acknowledged after a kill, before it stops
OCTET = {"Content-Type": "application/octet-stream"}
TERM_HEADER = "replication-term"  # an acknowledgement's term, where the server names it
MAX_READ_REQUESTS = 100  # a read gives up (not fresh) after this many answers
T = TypeVar("T")


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
    timeout: float = 10.0  # seconds a client waits for an answer
    readers: int = 1  # per stream

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
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:
            tasks = []
            for i, stream in enumerate(self.streams):
                tasks.append(self._plain(client, f"w{i}", stream))
                tasks.append(self._producer(client, f"p{i}", stream))
                for j in range(self.readers):
                    tasks.append(self._reader(client, f"r{i}" + (f".{j}" if j else ""), stream))
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
            if TERM_HEADER in r.headers:
                op.term = int(r.headers[TERM_HEADER])
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
                got = await read_from(client, server.url, stream)
            except httpx.HTTPError as exc:
                self.history.complete(op, "info", type(exc).__name__)
            else:
                if got is None:
                    self.history.complete(op, "info", "not served")
                else:
                    op.fresh_at = got[1]
                    self.history.complete(op, "ok", "200", got[0])
            await asyncio.sleep(0.05)


async def read_from(
    client: httpx.AsyncClient, origin: str, stream: str
) -> tuple[bytes, float | None] | None:
    """A stream's content on one server and when the request answered up to date was
    sent (None: no answer said so), or None when that server does not serve it:
    ``testkit.stream_reads.read_served`` for the history checker's concurrent readers, which need an
    async client."""
    out, offset = b"", "-1"
    for _ in range(MAX_READ_REQUESTS):
        sent = time.monotonic()
        r = await client.get(f"{origin}/v1/stream/{stream}", params={"offset": offset})
        if r.status_code != 200:
            return None
        out += r.content
        moved = r.headers["stream-next-offset"] != offset
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out, sent
        if not moved and not r.content:
            break  # neither up to date nor any further: a stale replica that says so
    return out, None


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


def recopies_of(rs: ReplicaSet, name: str) -> int:
    """How often a server re-copied itself from a primary (its log says so each time)."""
    return Path(rs.server(name).log).read_text(errors="replace").count("re-copying everything")
