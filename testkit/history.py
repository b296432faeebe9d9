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
"""

from __future__ import annotations

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

    @property
    def result(self) -> Outcome:
        return self.outcome or "info"


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

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.unexpected
            or self.reordered
            or self.unstable_reads
            or self.garbage
        )

    def summary(self) -> str:
        problems = {
            k: v[:10]
            for k, v in asdict(self).items()
            if isinstance(v, list) and v  # the first few of each kind
        }
        return (
            f"{self.attempts} append requests, {self.appends} messages ({self.acknowledged} "
            "acknowledged, "
            f"{self.unknown_landed} unknown that landed, {self.unknown_lost} unknown that did "
            f"not), {self.reads} reads; problems: {problems or 'none'}"
        )


class History:
    """The operations of one test run, in invocation order; safe to share between threads."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
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

    def dump(self, path: Path) -> None:
        """The history as JSON lines, for reading after a failure."""
        with open(path, "w") as out:
            for op in self.ops:
                row = asdict(op)
                row["value"] = op.value[:200].decode(errors="replace")
                out.write(json.dumps(row) + "\n")


def check(history: History, final: dict[str, bytes]) -> Report:
    """Judge ``history`` against the final content of each stream it touched."""
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
    return report
