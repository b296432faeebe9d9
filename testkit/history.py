"""A history of client operations and a checker for it, in the spirit of Jepsen.

Every operation a test's clients perform is recorded twice: when it is
invoked and when its result comes back. The result is one of three, as in
Jepsen's histories:

- ``ok``: acknowledged (2xx). An acknowledged append must be in the final
  stream, exactly once;
- ``fail``: definitely not applied (a 4xx: the request was refused as bad);
  it must not be in the final stream;
- ``info``: unknown (connection cut, timeout, 5xx such as a 503 from a
  standby or from a primary that could not reach enough replicas in time).
  It may or may not be in the final stream, but at most once, and only where
  its client's order allows.

Appends carry unique messages ``<TOKEN|padding>``: the token names the
logical write (a plain writer mints a new token per attempt, since it cannot
tell the server it is retrying; an idempotent producer resends the same
token with the same Producer-Seq, which must never land twice). Reads are
catch-up reads from the start of a stream, so what a read returned must be a
prefix of the final stream: a read that saw bytes later rolled back is a
read of uncommitted data.

The checker judges the history against the final content of each stream
(after the test has checked that every replica holds the same bytes). It
does not decide linearizability in general (Knossos does that, at a cost
exponential in concurrency); these checks are the ones the durability
promise makes, and each is cheap and exact.

The fault tests (``tests/replication/test_faults_*.py``) add two promises about deposed, paused and
partitioned replicas, checked when the history holds what they need:

- **no stale read claimed fresh**: a read whose last answer said
  ``Stream-Up-To-Date: true`` (``Op.fresh_at``: when that request was sent)
  must hold every write acknowledged more than ``bound`` seconds before it
  (``check(..., bound=)``; the server's ``replication_read_staleness``);
- **no acknowledgement from a deposed primary**: no replica acknowledges a
  write sent after another replica was seen primary at a higher term. The
  test's monitor polls ``GET /replication`` on every server and records each
  answer (``History.observe``); an ack's term is the one its answer named
  (``Op.term``, from a ``Replication-Term`` header, when the server sends
  one); else, when its server was seen as something else just before the
  ack and primary just after, the term it is seen at after (elected again
  between two polls); else the highest term its server was seen primary at
  before the ack came back (or, never seen primary by then, a new primary
  that answered before the monitor's next poll: the first term it is seen
  primary at).
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

Outcome = Literal["ok", "fail", "info"]
Kind = Literal["append", "read"]

# <token|padding>: the token names the write, the padding varies its size.
MESSAGE = re.compile(rb"<([A-Za-z0-9_.:-]+)\|([a-z]*)>")


def message(token: str, padding: int = 0) -> bytes:
    """The bytes an append sends for ``token`` (``padding`` filler letters)."""
    if not re.fullmatch(r"[A-Za-z0-9_.:-]+", token):
        raise ValueError(f"a token is letters, digits and _.:- only: {token!r}")
    return b"<" + token.encode() + b"|" + b"x" * padding + b">"


def parse(content: bytes) -> list[str]:
    """The tokens of a stream's messages in order; ValueError on a torn or foreign byte."""
    tokens: list[str] = []
    pos = 0
    for m in MESSAGE.finditer(content):
        if m.start() != pos:
            raise ValueError(
                f"garbage or a torn message at byte {pos}: {content[pos : pos + 60]!r}"
            )
        tokens.append(m.group(1).decode())
        pos = m.end()
    if pos != len(content):
        raise ValueError(f"a torn message at the tail, byte {pos}: {content[pos : pos + 60]!r}")
    return tokens


@dataclass
class Op:
    """One operation: its invocation, and its result once that came back."""

    index: int
    process: str  # the client: one process performs one operation at a time
    kind: Kind
    stream: str
    token: str = ""  # appends: the token of the message sent
    server: str = ""  # where the request went
    invoked: float = 0.0  # monotonic seconds
    completed: float | None = None
    outcome: Outcome | None = None  # None: never completed, which counts as info
    detail: str = ""  # status code or error
    value: bytes = b""  # reads: what came back
    fresh_at: float | None = None  # reads: when the request answered up to date was sent
    term: int | None = None  # appends: the term the acknowledgement named, if it named one

    @property
    def result(self) -> Outcome:
        return self.outcome or "info"


@dataclass
class Seen:
    """One answer of ``GET /replication`` (None fields: the server did not answer)."""

    server: str
    sent: float
    received: float
    role: str | None
    term: int | None


@dataclass
class Report:
    """What the checker found; ``ok`` when nothing."""

    attempts: int = 0  # append requests
    appends: int = 0  # distinct messages (a producer's retries resend one)
    acknowledged: int = 0
    unknown_landed: int = 0  # info appends that turned out to be applied
    unknown_lost: int = 0  # info appends that were not (allowed)
    reads: int = 0
    lost: list[str] = field(default_factory=list)  # acknowledged, not in the final stream
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # refused or never sent, yet present
    reordered: list[str] = field(default_factory=list)
    unstable_reads: list[str] = field(default_factory=list)  # saw data later missing
    garbage: list[str] = field(default_factory=list)
    stale_reads: list[str] = field(default_factory=list)  # fresh, yet older than the bound
    deposed_acks: list[str] = field(default_factory=list)  # after a higher term's primary
    fresh_reads: int = 0  # reads that said up to date
    staleness: float = 0.0  # seconds: the oldest acknowledged write a fresh read missed
    pause: float = 0.0  # seconds: the longest time without any acknowledgement

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.unexpected
            or self.reordered
            or self.unstable_reads
            or self.garbage
            or self.stale_reads
            or self.deposed_acks
        )

    def summary(self) -> str:
        problems = {
            f"{k} ({len(v)})": v[:10]
            for k, v in asdict(self).items()
            if isinstance(v, list) and v  # how many, and the first few of each kind
        }
        return (
            f"{self.attempts} append requests, {self.appends} messages ({self.acknowledged} "
            "acknowledged, "
            f"{self.unknown_landed} unknown that landed, {self.unknown_lost} unknown that did "
            f"not), {self.reads} reads ({self.fresh_reads} said up to date); "
            f"problems: {problems or 'none'}"
        )


class History:
    """The operations of one test run, in invocation order; safe to share between threads."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.seen: list[Seen] = []  # the set's roles as a monitor saw them
        self._lock = threading.Lock()

    def invoke(
        self, process: str, kind: Kind, stream: str, *, token: str = "", server: str = ""
    ) -> Op:
        with self._lock:
            op = Op(len(self.ops), process, kind, stream, token, server, invoked=time.monotonic())
            self.ops.append(op)
            return op

    def complete(self, op: Op, outcome: Outcome, detail: str = "", value: bytes = b"") -> None:
        op.completed = time.monotonic()
        op.outcome = outcome
        op.detail = detail
        op.value = value

    def observe(self, server: str, sent: float, role: str | None, term: int | None) -> None:
        """A monitor's answer from ``server`` to a ``GET /replication`` sent at ``sent``."""
        with self._lock:
            self.seen.append(Seen(server, sent, time.monotonic(), role, term))

    def dump(self, path: Path) -> None:
        """The history as JSON lines, for reading after a failure."""
        with open(path, "w") as out:
            for op in self.ops:
                row = asdict(op)
                row["value"] = op.value[:200].decode(errors="replace")
                out.write(json.dumps(row) + "\n")
            for seen in self.seen:
                out.write(json.dumps({"seen": asdict(seen)}) + "\n")


def check(history: History, final: dict[str, bytes], *, bound: float | None = None) -> Report:  # noqa: C901 - one pass over a history, every rule beside the others
    """Judge ``history`` against the final content of each stream it touched; with
    ``bound``, also the reads that said they were up to date (module doc)."""
    report = Report()
    present: dict[str, dict[str, list[int]]] = {}  # stream -> token -> positions
    for stream, content in final.items():
        try:
            tokens = parse(content)
        except ValueError as exc:
            report.garbage.append(f"{stream}: {exc}")
            tokens = []
        where: dict[str, list[int]] = {}
        for i, token in enumerate(tokens):
            where.setdefault(token, []).append(i)
        present[stream] = where

    appends = [op for op in history.ops if op.kind == "append"]
    report.attempts = len(appends)
    by_token: dict[tuple[str, str], list[Op]] = {}
    for op in appends:
        by_token.setdefault((op.stream, op.token), []).append(op)

    for (stream, token), ops in by_token.items():
        report.appends += 1
        positions = present.get(stream, {}).get(token, [])
        outcomes = {op.result for op in ops}
        if len(positions) > 1:
            report.duplicated.append(f"{stream}: {token} x{len(positions)}")
        if "ok" in outcomes:
            report.acknowledged += 1
            if not positions:
                report.lost.append(f"{stream}: {token}")
        elif outcomes == {"fail"}:
            if positions:
                report.unexpected.append(f"{stream}: {token} (refused, yet present)")
        elif positions:
            report.unknown_landed += 1
        else:
            report.unknown_lost += 1

    sent = set(by_token)
    for stream, where in present.items():
        for token in where:
            if (stream, token) not in sent:
                report.unexpected.append(f"{stream}: {token} (never sent)")

    # A client performs one operation at a time: its writes that landed are in its order.
    firsts: dict[tuple[str, str], list[str]] = {}
    seen: set[tuple[str, str, str]] = set()
    for op in appends:
        if (op.process, op.stream, op.token) not in seen:
            seen.add((op.process, op.stream, op.token))
            firsts.setdefault((op.process, op.stream), []).append(op.token)
    for (process, stream), tokens in firsts.items():
        where = present.get(stream, {})
        order = [where[t][0] for t in tokens if t in where]
        if order != sorted(order):
            report.reordered.append(f"{stream}: client {process}")

    for op in history.ops:
        if op.kind != "read" or op.result != "ok":
            continue
        report.reads += 1
        content = final.get(op.stream, b"")
        if not content.startswith(op.value):
            report.unstable_reads.append(
                f"{op.stream}: read #{op.index} on {op.server} returned {len(op.value)} bytes "
                "that are not a prefix of the final stream"
            )
    if bound is not None:
        _stale_reads(history, present, bound, report)
    _deposed_acks(history, report)
    acks = sorted(op.completed for op in appends if op.outcome == "ok" and op.completed)
    report.pause = max((b - a for a, b in itertools.pairwise(acks)), default=0.0)
    return report


def _stale_reads(
    history: History, present: dict[str, dict[str, list[int]]], bound: float, report: Report
) -> None:
    """Fresh reads that miss a write acknowledged more than ``bound`` before them.

    A read is a prefix of the final stream (else it is an unstable read, above), so
    the writes it misses are those at or past its length in messages: the oldest
    acknowledgement among them, a suffix minimum, is how stale the read was.
    """
    acked: dict[str, dict[str, float]] = {}  # stream -> token -> its first acknowledgement
    for op in history.ops:
        if op.kind == "append" and op.outcome == "ok" and op.completed is not None:
            first = acked.setdefault(op.stream, {})
            first[op.token] = min(first.get(op.token, op.completed), op.completed)
    oldest_from: dict[str, list[float]] = {}  # stream -> k -> oldest ack at position >= k
    for stream, where in present.items():
        by_position = sorted((pos[0], t) for t, pos in where.items())
        times = [acked.get(stream, {}).get(t, float("inf")) for _, t in by_position]
        suffix = [float("inf")] * (len(times) + 1)
        for i in range(len(times) - 1, -1, -1):
            suffix[i] = min(times[i], suffix[i + 1])
        oldest_from[stream] = suffix
    for op in history.ops:
        if op.kind != "read" or op.result != "ok" or op.fresh_at is None:
            continue
        report.fresh_reads += 1
        suffix = oldest_from.get(op.stream, [float("inf")])
        seen = len(MESSAGE.findall(op.value))
        oldest = suffix[min(seen, len(suffix) - 1)]
        age = op.fresh_at - oldest
        if age <= 0:
            continue
        report.staleness = max(report.staleness, age)
        if age > bound:
            report.stale_reads.append(
                f"{op.stream}: read #{op.index} on {op.server} said up to date with "
                f"{seen} messages, missing a write acknowledged {age:.2f} s before it "
                f"(bound {bound} s)"
            )


def _ack_term(
    op: Op,
    first: dict[tuple[str, int], float],
    sightings: dict[str, list[Seen]],
    received: dict[str, list[float]],
) -> int:
    """The term of an acknowledgement whose answer named none. A replica acknowledges
    only as primary: seen as something else (a standby, down) just before the ack and
    as primary just after, it was elected between, at the term it is seen at after (a
    check that took an older sighting would blame a replica elected again on the term
    it had before). Else, the highest term its server was seen primary at by the ack;
    never seen primary by then (newly elected), the first term it is seen primary at.
    ``sightings``: each server's, in the order they came back; ``received``: when each
    came back, made once for every ack's search."""
    assert op.completed is not None
    done = op.completed
    mine = sightings.get(op.server, [])
    k = bisect.bisect_right(received.get(op.server, []), done)
    if 0 < k < len(mine) and mine[k - 1].role != "primary" and mine[k].role == "primary":
        return mine[k].term or 0
    term = max((t for (srv, t), at in first.items() if srv == op.server and at <= done), default=0)
    if term == 0:
        later = [(at, t) for (srv, t), at in first.items() if srv == op.server]
        term = min(later, default=(0.0, 0))[1]
    return term


def _deposed_acks(history: History, report: Report) -> None:
    """Acknowledgements of writes sent after another replica was seen primary at a
    higher term than the acknowledging replica's (module doc)."""
    first: dict[tuple[str, int], float] = {}  # (server, term) -> first seen primary at it
    sightings: dict[str, list[Seen]] = {}
    for s in sorted(history.seen, key=lambda s: s.received):
        sightings.setdefault(s.server, []).append(s)
        if s.role == "primary" and s.term is not None:
            key = (s.server, s.term)
            first[key] = min(first.get(key, s.received), s.received)
    if not first:
        return
    received = {srv: [s.received for s in seen] for srv, seen in sightings.items()}
    for op in history.ops:
        if op.kind != "append" or op.outcome != "ok" or op.completed is None:
            continue
        term = op.term if op.term is not None else _ack_term(op, first, sightings, received)
        higher = min(
            (
                (at, srv, t)
                for (srv, t), at in first.items()
                if srv != op.server and t > term and at < op.invoked
            ),
            default=None,
        )
        if higher is not None:
            report.deposed_acks.append(
                f"{op.stream}: {op.token} acknowledged by {op.server} (term {term}) though "
                f"{higher[1]} was seen primary at term {higher[2]} "
                f"{op.invoked - higher[0]:.2f} s before the write was sent"
            )
