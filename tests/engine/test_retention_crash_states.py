"""Crash states of retention drops: every state a power cut could leave around a drop.

A workload appends to a stream under a ``max-bytes`` policy and to one under none,
in shared batches, across WAL rotations and checkpoints, and sweeps now and then
(each sweep commits a new retained start, then punches the bytes below it: the
punch is recorded as a write of zeros, ``testkit.crashstates``). Each explored
state is recovered by a fresh store and must show:

- the retained start is one the workload committed (or 0), and at or past the
  last one acknowledged before the crash: never an older start come back, never
  a start that was not a drop;
- every acknowledged append is there, the tail is a batch boundary, and the
  content from the start to the tail is exactly what was written (no gap, no
  zeros from a punch that reached retained data);
- an offset below the start is refused (410), and the Spark reader reads the
  same content from the same start.

It fails when the engine punches before the new start's WAL frame is flushed
(tried by moving the punch there: a crash in between recovers the old start
over zeros).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from stream_server.engine import Engine
from stream_server.streams.errors import OffsetGone
from stream_server.streams.retention import parse_policies
from stream_server.streams.store import AppendRequest, CreateRequest, StoreLimits, StreamStore
from testkit import summary
from testkit.crashstates import CrashState, Recording, check_each, recorded
from testkit.spark_rows import every_stream

pytestmark = pytest.mark.slow

BUDGET = int(os.environ.get("CRASH_STATES", "1500"))
MIXED = int(os.environ.get("CRASH_MIXED", "3"))
BIN = "application/octet-stream"
POLICY = ("r/:max-bytes=4KiB",)


class History:
    """What the workload wrote and which starts it committed, with their acknowledgements."""

    def __init__(self) -> None:
        self.content: dict[str, bytes] = {"r/s": b"", "keep": b""}
        self.tails: dict[str, set[int]] = {"r/s": {0}, "keep": {0}}
        self.acks: list[tuple[int, str, str, int]] = []  # place, kind, path, value
        self.starts: set[int] = {0}


async def run_workload(data_dir: Path, rec: Recording) -> History:
    h = History()
    engine = Engine(data_dir, map_size=1 << 20, checkpoint_bytes=6 * 1024)
    store = StreamStore(
        data_dir,
        engine=engine,
        limits=StoreLimits(sweep_interval=3600, retention=parse_policies(POLICY)),
    )
    await store.start()
    store.retention.stop()  # sweeps when the workload says

    async def append(path: str, data: bytes) -> None:
        r = await store.append(AppendRequest(path, BIN, data))
        h.content[path] += data
        h.tails[path].add(r.tail)
        h.acks.append((rec.ack(("append", path)), "append", path, r.tail))

    for path in ("r/s", "keep"):
        await store.create(CreateRequest(path, BIN))
        h.acks.append((rec.ack(("create", path)), "create", path, 0))
    # Sweeps come seldom enough (and "keep" writes enough WAL) that what a sweep drops
    # was checkpointed already: a WAL replay cannot write it back over a premature punch.
    for i in range(16):
        await asyncio.gather(append("r/s", bytes([65 + i]) * 1100), append("keep", b"k" * 2500))
        if i % 4 == 3:
            await store.retention.sweep()
            start = store.earliest(store.get("r/s"))
            h.starts.add(start)
            h.acks.append((rec.ack(("drop", "r/s")), "drop", "r/s", start))
    await store.stop()
    assert len(h.starts) >= 4, h.starts  # the workload dropped several times
    return h


async def check_state(data_dir: Path, h: History, point: int) -> dict[str, tuple[int, bytes]]:
    store = StreamStore(data_dir, limits=StoreLimits(sweep_interval=3600))
    await store.start()
    got: dict[str, tuple[int, bytes]] = {}
    try:
        need: dict[tuple[str, str], int] = {}
        for place, kind, path, value in h.acks:
            if place >= point:
                break
            need[kind, path] = max(need.get((kind, path), 0), value)
        for path in ("r/s", "keep"):
            s = store.streams.get(path)
            if s is None:
                assert ("create", path) not in need, f"{path}: created (acknowledged) but missing"
                continue
            assert s.tail >= need.get(("append", path), 0), f"{path}: acknowledged data lost"
            assert s.tail in h.tails[path], f"{path}: tail {s.tail} is no batch boundary"
            first = store.earliest(s)
            assert first in h.starts, f"{path}: start {first} was never committed"
            assert first >= need.get(("drop", path), 0), (
                f"{path}: acknowledged start {need.get(('drop', path))} lost (got {first})"
            )
            if path == "keep":
                assert first == 0
            r = await store.read(s, first, 1 << 30)
            data = b"".join(bytes(p) for p in r.payloads)
            assert data == h.content[path][first : s.tail], f"{path}: content differs"
            if first > 0:
                with pytest.raises(OffsetGone):
                    await store.read(s, first - 1, 1)
            got[path] = (first, data)
    finally:
        await store.stop()
    return got


def test_every_crash_state_around_a_drop_keeps_one_start_and_the_data_after_it(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    rec = Recording(data_dir)
    h = recorded(rec, lambda rec: run_workload(data_dir, rec))
    assert sum(op[0] == "lmdb_sync" for op in rec.ops) >= 3  # checkpoints ran
    # Punches were recorded (as writes of zeros into the stream's segment file).
    assert any(
        op[0] == "write" and op[1].startswith("segments/") and not any(op[3]) for op in rec.ops
    )

    starts_seen: set[int] = set()

    def check(state: CrashState, directory: Path) -> None:
        got = asyncio.run(check_state(directory, h, state.point))
        rows, _ = every_stream(directory)
        for path, (first, data) in got.items():
            if path == "r/s":
                starts_seen.add(first)
            assert b"".join(rows.get(path, [])) == data, f"{path}: Spark disagrees"

    explored, distinct = check_each(rec, BUDGET, tmp_path / "states", check, mixed=MIXED)
    summary.report(
        "figures",
        f"retention crash states: {len(rec.ops)} ops, {explored} explored, {distinct} "
        f"distinct, starts recovered {sorted(starts_seen)}",
    )
    assert len(starts_seen) >= 3  # crashes before, between and after drops were explored
