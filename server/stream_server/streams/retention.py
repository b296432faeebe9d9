"""Retention: streams that run forever on a bounded disk (docs/retention.md).

A policy bounds the streams under a path prefix by size (``max-bytes``: the
stream's own segment file keeps at most that many bytes of records) and/or
age (``max-age``: records committed longer ago than that go). The longest
matching prefix wins; a stream under no prefix keeps everything.

Dropping moves a stream's *retained start* forward to a record boundary
(``engine.ops.DropHead``); the engine commits the new start in a group-commit
batch (durable, in the WAL frame like any change) and only then punches the
bytes below it out of the file, so a crash leaves the old start or the new
one, and recovery punches again. Reads before the start answer 410 Gone
(``OffsetGone``, with the earliest retained offset); ``offset=-1`` reads
from it.

The sweeper visits every stream under a policy once a ``sweep_interval``,
and at once after an append takes a ``max-bytes`` stream past its bound by
more than a sixteenth of it (``_slack``: a drop per append would cost a
batch per append). The
disk work (finding the record boundary: record headers only) runs off the
loop; the drops of one sweep go in one batch.

Forks: a stream that forks read through (``refcount > 0``) is not trimmed
while they exist: a fork never loses what it serves. A fork's earliest unit
is its own retained start once its own log was trimmed, else its source's
(it inherits what the source had dropped when the fork was made); a fork at
an offset the source no longer holds is refused with 410.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from stream_server.engine import BatchStats, Engine
from stream_server.engine.ops import DropHead, Op
from stream_server.streams.clock import WALL_CLOCK, Clock
from stream_server.streams.errors import StreamError
from stream_server.streams.model import Stream
from stream_server.streams.pending import StreamTable

log = logging.getLogger("stream_server.streams")

Commit = Callable[[list[Op], int, Callable[[], None]], Awaitable[BatchStats]]

_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(r"(\d+)([A-Za-z]*)")
_AGE = re.compile(r"(\d+)([smhd])")


@dataclass(frozen=True, slots=True)
class Policy:
    """What streams under ``prefix`` keep: at most ``max_bytes`` of records and none
    older than ``max_age`` seconds (either may be None, not both)."""

    prefix: str
    max_bytes: int | None = None
    max_age: float | None = None

    def describe(self) -> str:
        rules = []
        if self.max_bytes is not None:
            rules.append(f"max-bytes={self.max_bytes}")
        if self.max_age is not None:
            rules.append(f"max-age={self.max_age:g}s")
        return f"{self.prefix}:{','.join(rules)}"


def parse_policy(text: str) -> Policy:
    """``PREFIX:RULES`` as the ``--retention`` flag takes it; ValueError saying what is wrong."""
    prefix, sep, rules = text.strip().partition(":")
    if not sep:
        raise ValueError(f"retention {text!r}: expected PREFIX:RULES, e.g. 'logs/:max-age=7d'")
    if prefix.startswith("/"):
        raise ValueError(
            f"retention {text!r}: the prefix is relative to the stream base path "
            f"(write {prefix.lstrip('/')!r})"
        )
    found: dict[str, int | float] = {}
    for rule in rules.split(","):
        key, eq, value = rule.strip().partition("=")
        if not eq or not value:
            raise ValueError(f"retention {text!r}: rule {rule.strip()!r} is not NAME=VALUE")
        if key in found:
            raise ValueError(f"retention {text!r}: {key} given twice")
        parse = _RULES.get(key)
        if parse is None:
            raise ValueError(
                f"retention {text!r}: unknown rule {key!r} (known: max-bytes, max-age)"
            )
        found[key] = parse(text, value)
    max_bytes, max_age = found.get("max-bytes"), found.get("max-age")
    return Policy(
        prefix,
        None if max_bytes is None else int(max_bytes),  # an int as parsed: never through float
        None if max_age is None else float(max_age),
    )


def _max_bytes(text: str, value: str) -> int:
    m = _SIZE.fullmatch(value)
    if m is None or m.group(2) not in _SIZE_UNITS:
        raise ValueError(
            f"retention {text!r}: max-bytes {value!r} is not a size "
            "(bytes, or with KiB, MiB, GiB, TiB: e.g. 512KiB, 10GiB)"
        )
    size = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if size < 1:
        raise ValueError(f"retention {text!r}: max-bytes must be positive")
    return size


def _max_age(text: str, value: str) -> float:
    a = _AGE.fullmatch(value)
    if a is None:
        raise ValueError(
            f"retention {text!r}: max-age {value!r} is not a duration "
            "(a number with s, m, h or d: e.g. 30s, 15m, 12h, 7d)"
        )
    age = float(int(a.group(1)) * _AGE_UNITS[a.group(2)])
    if age <= 0:
        raise ValueError(f"retention {text!r}: max-age must be positive")
    return age


_RULES: dict[str, Callable[[str, str], int | float]] = {
    "max-bytes": _max_bytes,
    "max-age": _max_age,
}


def parse_policies(texts: Iterable[str]) -> tuple[Policy, ...]:
    """Every policy, each prefix at most once (ValueError otherwise)."""
    policies = tuple(parse_policy(t) for t in texts if t.strip())
    prefixes = [p.prefix for p in policies]
    for p in set(prefixes):
        if prefixes.count(p) > 1:
            raise ValueError(f"retention: prefix {p!r} is given more than once")
    return policies


def match(policies: tuple[Policy, ...], path: str) -> Policy | None:
    """The policy of the longest prefix ``path`` starts with, or None."""
    best: Policy | None = None
    for p in policies:
        if path.startswith(p.prefix) and (best is None or len(p.prefix) > len(best.prefix)):
            best = p
    return best


def earliest(table: StreamTable, engine: Engine, s: Stream) -> int:
    """The first unit of ``s`` a read may ask for (offsets below it answer 410).

    A stream's own retained start, unless it is a fork whose own log was never
    trimmed: then its source's earliest, as far as the fork reads the source.
    """
    tail = engine.tails.get(s.id)
    own = tail.start if tail is not None else s.meta.fork_offset
    if own > s.meta.fork_offset or s.meta.fork_from is None:
        return own
    parent = table.find(s.meta.fork_from)
    if parent is None:
        return own
    return min(earliest(table, engine, parent), s.meta.fork_offset)


def _slack(max_bytes: int) -> int:
    """How far past its bound an append may take a stream before the sweeper is woken
    for it (the periodic sweep trims any excess): each drop is a batch of its own, so a
    drop per append would halve append throughput on a stream at its bound."""
    return max(max_bytes // 16, 4096)


class Retention:
    """The policies, and the sweeper that carries them out."""

    def __init__(
        self,
        policies: tuple[Policy, ...],
        table: StreamTable,
        engine: Engine,
        *,
        interval: float,
        commit: Commit,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        self.policies = policies
        self._table = table
        self._engine = engine
        self._interval = interval
        self._commit = commit
        self.clock = clock  # seconds since the epoch; records carry commit times (µs)
        self._matched: dict[str, Policy | None] = {}
        # stream id -> (retained start position, commit time of the record there, µs):
        # the oldest retained record, read again only when the start moves.
        self._first: dict[int, tuple[int, int]] = {}
        # (stream id, policy) of every stream under a policy as the last sweep found them:
        # the metrics and the oldest-record times work from it, so that only a sweep walks
        # the streams (and loads them).
        self._governed: list[tuple[int, Policy]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.paused = False  # a standby: the primary's drops reach it as replicated frames

    def policy(self, path: str) -> Policy | None:
        if not self.policies:
            return None
        try:
            return self._matched[path]
        except KeyError:
            p = self._matched[path] = match(self.policies, path)
            return p

    def appended(self, s: Stream) -> None:
        """After a durable append: wake the sweeper if ``s`` went past its byte bound."""
        if self._wake is None or not self.policies:
            return
        p = self.policy(s.path)
        if p is None or p.max_bytes is None:
            return
        tail = self._engine.tails.get(s.id)
        if tail is not None and tail.file_len - tail.start_pos > p.max_bytes + _slack(p.max_bytes):
            self._wake.set()

    # ---------------------------------------------------------------- sweeping

    async def sweep(self) -> int:
        """Move every stream's retained start as its policy says; returns how many moved."""
        if not self.policies:
            return 0
        now = self.clock()
        todo: list[tuple[Stream, int, int | None]] = []
        governed: list[tuple[int, Policy]] = []
        for path, s in self._managed():
            p = self.policy(path)
            if p is not None:
                governed.append((s.id, p))
            if p is not None and s.committed:
                bounds = self._bounds(s, p, now)
                if bounds is not None:
                    todo.append((s, *bounds))
        self._governed = governed
        if not todo:
            await self._note_oldest()
            return 0
        loop = asyncio.get_running_loop()
        points = await loop.run_in_executor(None, self._points, todo)
        ops: list[Op] = []
        for (s, _, _), point in zip(todo, points, strict=True):
            if point is not None and self._table.by_path.get(s.path) is s:
                ops.append(DropHead(s.id, point[0], point[1]))
        if ops:
            await self._commit(ops, 0, lambda: None)
        await self._note_oldest()
        return len(ops)

    def _managed(self) -> list[tuple[str, Stream]]:
        """The streams under some policy's prefix, loaded (``StreamTable.get``): the
        others are never looked at, so a sweep costs the streams it governs."""
        out: list[tuple[str, Stream]] = []
        seen: set[str] = set()
        for prefix in sorted({p.prefix for p in self.policies}):
            for path in self._engine.stored_paths(prefix):
                s = self._table.get(path)
                if s is not None and path not in seen:
                    seen.add(path)
                    out.append((path, s))
        return out

    def _bounds(self, s: Stream, p: Policy, now: float) -> tuple[int, int | None] | None:
        """What ``p`` asks of ``s`` now: the least file position to keep, and the commit
        time (µs) before which records go; None when nothing can go (no disk read)."""
        if s.pending.meta.refcount > 0:
            return None  # forks read through it: pinned (see the module docstring)
        tail = self._engine.tails.get(s.id)
        if tail is None or tail.start >= tail.unit:
            return None
        min_pos = tail.start_pos
        if p.max_bytes is not None:
            min_pos = max(min_pos, tail.file_len - p.max_bytes)
        cutoff = int((now - p.max_age) * 1_000_000) if p.max_age is not None else None
        if min_pos <= tail.start_pos:
            if cutoff is None:
                return None
            first = self._first.get(s.id)
            if first is not None and first[0] == tail.start_pos and first[1] >= cutoff:
                return None  # its oldest record is young enough: no disk read this sweep
        return min_pos, cutoff

    async def _note_oldest(self) -> None:
        """Read the commit time of each trimmed-or-new first record (for the metrics)."""
        need: list[int] = []
        live: set[int] = set()
        for sid, _ in self._governed:
            live.add(sid)
            tail = self._engine.tails.get(sid)
            seen = self._first.get(sid)
            if tail is not None and (seen is None or seen[0] != tail.start_pos):
                need.append(sid)
        for sid in set(self._first) - live:
            del self._first[sid]
        if not need:
            return
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, self._times, need)
        for sid, got in zip(need, found, strict=True):
            if got is None:
                self._first.pop(sid, None)
            else:
                self._first[sid] = got

    def _times(self, sids: list[int]) -> list[tuple[int, int] | None]:
        out: list[tuple[int, int] | None] = []
        for sid in sids:
            try:
                out.append(self._engine.first_record_time(sid))
            except OSError:
                out.append(None)
        return out

    def stats(self) -> dict[str, tuple[int, float]]:
        """Per policy (by prefix): retained bytes of its streams' own files, and the age
        in seconds of their oldest retained record, over the streams the last sweep found
        (0: none). A metrics scrape: it loads no stream."""
        out = {p.prefix: (0, 0.0) for p in self.policies}
        now_us = self.clock() * 1_000_000
        for sid, p in self._governed:
            tail = self._engine.tails.get(sid)
            if tail is None:
                continue
            size, age = out[p.prefix]
            size += tail.file_len - tail.start_pos
            first = self._first.get(sid)
            if first is not None:
                age = max(age, (now_us - first[1]) / 1_000_000)
            out[p.prefix] = (size, age)
        return out

    def _points(self, todo: list[tuple[Stream, int, int | None]]) -> list[tuple[int, int] | None]:
        """Each stream's new start (unit, file position), found in its log (worker thread)."""
        out: list[tuple[int, int] | None] = []
        for s, min_pos, cutoff in todo:
            try:
                point = self._engine.retention_point(
                    s.id, min_pos=min_pos, cutoff_us=cutoff, max_unit=s.tail
                )
            except OSError as exc:
                log.warning("retention: cannot read %s: %s", s.path, exc)
                point = None
            out.append(point)
        return out

    def start(self) -> None:
        if not self.policies or self.paused or self._task is not None:
            return
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._sweep_forever())
        log.info("retention: %s", "; ".join(p.describe() for p in self.policies))

    def stop(self) -> None:
        self._wake = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def pause(self) -> None:
        """Stop sweeping (a standby): its batches would be refused."""
        self.paused = True
        self.stop()

    def resume(self) -> None:
        """Sweep again (promoted to primary)."""
        self.paused = False
        self.start()

    async def _sweep_forever(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            try:
                await self.sweep()
            except StreamError as exc:
                log.warning("retention sweep: %s", exc)
            except Exception:
                log.exception("retention sweep failed")
