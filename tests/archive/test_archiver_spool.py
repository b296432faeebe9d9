"""The engine's WAL kept for the archive (engine/wal_keep.py) and the frame source
that reads it (archive/upload/wal_source.py), in-process on a real data directory."""

from __future__ import annotations

from pathlib import Path

from stream_format import wal as walmod
from stream_format.records import KIND_BYTES
from stream_server.archive.upload.wal_source import WalSource
from stream_server.engine import Engine
from stream_server.engine.ops import Append
from stream_server.engine.wal_keep import spool_dir, spooled_files
from testkit.engines import crash, new_stream, settled


def _engine(path: Path, floor: list[int] | None) -> Engine:
    engine = Engine(
        path,
        checkpoint_bytes=2048,
        archive_floor=None if floor is None else (lambda: floor[0]),
    )
    engine.open()
    return engine


def _append(engine: Engine, n: int) -> None:
    for i in range(n):
        engine.commit([Append(1, KIND_BYTES, [b"x%04d" % i * 40])])


def test_checkpoints_move_unarchived_wal_into_the_spool_and_the_source_reads_it_in_order(
    tmp_path: Path,
) -> None:
    floor = [0]
    engine = _engine(tmp_path, floor)
    new_stream(engine, "/a", 1)
    _append(engine, 60)  # several checkpoints at 2 KiB
    engine.close()
    assert spooled_files(engine.layout), "a checkpoint deleted WAL the archive lacks"
    source = WalSource(engine.layout, 0)
    reads = source.read(engine.lsn, 1 << 20)
    assert [r.frame.lsn for r in reads] == list(range(1, engine.lsn + 1))
    for r in reads:
        assert walmod.decode_frame(r.frame.frame)[0] == r.frame.lsn
    # A clean restart keeps numbering: the lsn never repeats (the archive needs that).
    last = engine.lsn
    engine = _engine(tmp_path, floor)
    assert engine.lsn == last
    _append(engine, 1)
    assert engine.lsn == last + 1
    assert [r.frame.lsn for r in source.read(engine.lsn, 1 << 20)] == [last + 1]
    crash(engine)


def test_archived_wal_is_deleted_and_a_start_without_archive_removes_the_spool(
    tmp_path: Path,
) -> None:
    floor = [0]
    engine = _engine(tmp_path, floor)
    new_stream(engine, "/a", 1)
    _append(engine, 30)
    settled(engine)
    before = set(spooled_files(engine.layout))
    assert before
    floor[0] = 1 << 40  # everything archived (ahead of time): checkpoints delete
    _append(engine, 30)
    engine.close()
    assert set(spooled_files(engine.layout)) == before
    engine = _engine(tmp_path, None)
    assert not spool_dir(engine.layout).exists()
    crash(engine)


def test_a_crash_replays_the_wal_and_then_spools_it(tmp_path: Path) -> None:
    floor = [0]
    engine = _engine(tmp_path, floor)
    new_stream(engine, "/a", 1)
    engine.commit([Append(1, KIND_BYTES, [b"y"])])
    last = engine.lsn
    crash(engine)
    engine = _engine(tmp_path, floor)
    assert engine.lsn == last
    assert not walmod.wal_files(engine.layout.wal)[:-1]  # only the new file
    source = WalSource(engine.layout, 0)
    assert [r.frame.lsn for r in source.read(last, 1 << 20)] == list(range(1, last + 1))
    crash(engine)
