"""Writers through a replica set's client Service, and the end check on its copies: what
the whole-system tests of a DurableStream under the operator share (a kill, a roll, a
switchover, a node drain: e2e/test_operator_replica_set.py, e2e/test_operator_drain.py).

The writers are idempotent producers that send every append to wherever the Service
routes now (``testkit.services.ServiceEndpoints``: its ready, selected pods) and retry
on a refused connection, no endpoint, or 503: a retry resends the same Producer-Seq, so
it can never land twice. Every attempt goes into a ``testkit.history.History``; the
longest wait a writer saw between two acknowledgements around an event is the pause
the tests print (never assert).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from testkit import wait_for
from testkit.history import History, message
from testkit.kubelet import Kubelet
from testkit.services import ServiceEndpoints
from testkit.stream_reads import read_served

OCTET = {"Content-Type": "application/octet-stream"}
# Each writer's pause between an acknowledgement and its next append: a steady load (about
# 30 appends a second for three writers) that leaves 2 shared cores to the servers' work.
PACE = 0.1
AFTER_EVENT = 5  # appends each writer must get acknowledged after an event
LIVENESS = 120.0  # seconds any awaited change may take before the test fails (2 shared cores)
T = TypeVar("T")


def until(what: Callable[[], T | None], message: str | Callable[[], str]) -> T:
    """``wait_for`` with the whole-system tests' liveness bound."""
    return wait_for(what, timeout=LIVENESS, message=message)


@dataclass
class Writers:
    """Idempotent producers (``writers``: producer id -> stream path) appending through
    the Service until stopped."""

    service: ServiceEndpoints
    history: History
    writers: dict[str, str]
    acks: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.acks = {w: [] for w in self.writers}

    def start(self) -> None:
        for process, stream in self.writers.items():
            t = threading.Thread(target=self._write, args=(process, stream), daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.errors, self.errors

    def acked_after(self, since: float) -> bool:
        return all(sum(1 for t in ts if t > since) >= AFTER_EVENT for ts in self.acks.values())

    def last_attempts(self) -> dict[str, str]:
        """Each writer's last attempt (where it went, what came back), for a failure."""
        last = {op.process: op for op in self.history.ops if op.kind == "append"}
        return {p: f"{op.token} to {op.server}: {op.result} {op.detail}" for p, op in last.items()}

    def resumed(self, started: float, event: str) -> float:
        """Once the set has settled after ``event`` (begun at ``started``): wait until every
        writer has had appends acknowledged again, and return the longest pause one saw."""
        settled_at = time.monotonic()
        until(
            lambda: self.acked_after(settled_at),
            lambda: f"appends after {event}: {self.last_attempts()}",
        )
        return self.pause(started, time.monotonic())

    def pause(self, start: float, end: float) -> float:
        """The longest any writer waited between two acknowledgements around [start, end]."""
        longest = 0.0
        for ts in self.acks.values():
            before = [t for t in ts if t <= start][-1:]
            around = before + [t for t in ts if start < t <= end]
            longest = max([longest, *(b - a for a, b in itertools.pairwise(around))])
        return longest

    def _write(self, process: str, stream: str) -> None:
        with httpx.Client(timeout=15) as client:
            seq = 0
            while not self.stop.is_set():
                headers = OCTET | {
                    "Producer-Id": process,
                    "Producer-Epoch": "0",
                    "Producer-Seq": str(seq),
                }
                token = f"{process}.{seq}"
                # The same message until acknowledged: a retry must never land twice.
                while not self._append(client, process, stream, token, headers):
                    if self.stop.is_set():
                        return  # its outcome stays unknown
                    time.sleep(0.05)
                self.acks[process].append(time.monotonic())
                seq += 1
                time.sleep(PACE)

    def _append(
        self,
        client: httpx.Client,
        process: str,
        stream: str,
        token: str,
        headers: dict[str, str],
    ) -> bool:
        """One attempt through the Service; True when acknowledged."""
        try:
            urls = self.service.urls()
        except httpx.HTTPError:
            return False  # the API server is going away at the end of the test
        if not urls:
            return False  # no ready primary behind the Service: a refused connection
        url = random.choice(urls)
        op = self.history.invoke(process, "append", stream, token=token, server=url)
        body = message(token, random.randint(0, 100))
        try:
            r = client.post(f"{url}/v1/stream/{stream}", content=body, headers=headers)
        except httpx.ConnectError as exc:  # nothing was sent
            self.history.complete(op, "fail", type(exc).__name__)
            return False
        except httpx.HTTPError as exc:  # sent, the answer lost: unknown
            self.history.complete(op, "info", type(exc).__name__)
            return False
        if r.status_code in (200, 204):
            self.history.complete(op, "ok", str(r.status_code))
            if "replication-term" in r.headers:  # the term that acknowledged it
                op.term = int(r.headers["replication-term"])
            return True
        primary = (r.headers.get("stream-primary") or "").rstrip("/")
        if r.status_code == 503 and primary and primary != url:
            # A standby's refusal (the label has not moved yet): never applied there.
            self.history.complete(op, "fail", f"503 from a standby, primary {primary}")
        elif r.status_code >= 500:
            self.history.complete(op, "info", f"{r.status_code} {r.text[:200]}")
        else:
            self.history.complete(op, "fail", f"{r.status_code} {r.text[:200]}")
            self.errors.append(f"{process}: append refused {r.status_code}: {r.text[:300]}")
            self.stop.set()
        return False


def create_streams(service: ServiceEndpoints, streams: list[str]) -> None:
    """Create each stream through the Service (retried while no primary accepts it)."""
    for stream in streams:

        def created(stream: str = stream) -> bool:
            for url in service.urls():
                r = httpx.put(f"{url}/v1/stream/{stream}", headers=OCTET, timeout=15)
                assert r.status_code in (200, 201, 503), r.text
                return r.status_code in (200, 201)
            return False

        until(created, f"stream {stream} created through the Service")


def converged(kubelet: Kubelet, streams: list[str], replicas: int) -> dict[str, bytes]:
    """Every pod's copy of every stream, once all ``replicas`` are byte-identical."""
    last: list[dict[str, bytes | None]] = []

    def same() -> dict[str, bytes] | None:
        nonlocal last
        with httpx.Client(timeout=10) as client:
            try:
                last = [
                    {s: read_served(client, f"{pod.url}/v1/stream/{s}") for s in streams}
                    for pod in sorted(kubelet.ready_pods(), key=lambda p: p.ordinal)
                ]
            except httpx.HTTPError:
                return None
        if len(last) != replicas or any(v is None for v in last[0].values()):
            return None
        if any(copy != last[0] for copy in last[1:]):
            return None
        return {k: v for k, v in last[0].items() if v is not None}

    def sizes() -> str:
        return str([{k: None if v is None else len(v) for k, v in c.items()} for c in last])

    return until(same, lambda: f"every replica holding the same bytes: sizes {sizes()}")
