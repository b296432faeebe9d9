"""Crash states (testkit/crashstates.py) of an engine that keeps WAL for the archive:
whatever a power cut leaves, every acknowledged frame is still in the spool or the
WAL, in order, for the archive to take (a checkpoint's move into the spool never
loses a file from both directories), and the recovered engine numbers on from the
last acknowledged frame."""

from __future__ import annotations

import os
from pathlib import Path

from stream_format.layout import Layout
from stream_format.records import KIND_BYTES
from stream_server.archive.upload.wal_source import WalSource
from stream_server.engine import Engine
from stream_server.engine.ops import Append
from testkit import summary
from testkit.crashstates import CrashState, Recording, check_each, recorded
from testkit.engines import crash, new_stream

BUDGET = int(os.environ.get("CRASH_STATES", "600"))
NOTHING_ARCHIVED = 0


def held_lsns(data_dir: Path) -> list[int]:
    source = WalSource(Layout(data_dir), 0)
    return [r.frame.lsn for r in source.read(1 << 62, 1 << 30)]


def test_every_crash_state_keeps_the_acknowledged_frames_for_the_archive(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    rec = Recording(data_dir)
    acked: list[tuple[int, int]] = []  # (place in the log, lsn)

    async def workload(rec: Recording) -> None:
        engine = Engine(
            data_dir,
            map_size=1 << 20,
            checkpoint_bytes=2048,
            archive_floor=lambda: NOTHING_ARCHIVED,
        )
        engine.open()
        new_stream(engine, "/a", 1)
        acked.append((rec.ack("create"), engine.lsn))
        for i in range(12):
            engine.commit([Append(1, KIND_BYTES, [bytes([65 + i]) * 700])])
            acked.append((rec.ack(("append", i)), engine.lsn))
        engine.close()

    recorded(rec, workload)
    assert sum(1 for op in rec.ops if op[0] == "link" and "archive/" in op[2]) >= 3

    def check(state: CrashState, directory: Path) -> None:
        need = max((lsn for place, lsn in acked if place < state.point), default=0)
        held = held_lsns(directory)
        assert held == list(range(1, len(held) + 1)), held
        assert len(held) >= need, f"acknowledged frame {need} is in neither wal/ nor archive/"
        engine = Engine(directory, map_size=1 << 20, archive_floor=lambda: NOTHING_ARCHIVED)
        engine.open()
        try:
            assert engine.lsn >= need
            assert held_lsns(directory) == list(range(1, engine.lsn + 1))
        finally:
            crash(engine)

    explored, distinct = check_each(rec, BUDGET, tmp_path / "states", check)
    summary.report(
        "figures",
        f"archive spool crash states: {len(rec.ops)} ops, {explored} explored, {distinct} distinct",
    )
    assert distinct > 0
