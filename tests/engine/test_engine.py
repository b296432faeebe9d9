"""The storage engine on real files: batches, reads, checkpoints and recovery."""

from __future__ import annotations

import os
import random
import threading

import pytest

from stream_format.layout import Layout
from stream_format.records import KIND_BYTES, KIND_JSON, Producer
from stream_server.engine import Engine, LayoutError, fsio
from stream_server.engine.batch import INDEX_GRANULARITY
from stream_server.engine.data_dir import prepare
from stream_server.engine.ops import (
    Append,
    DeleteStream,
    DropLog,
    PutProducer,
)
from testkit.engines import crash, new_stream, read_all


class Crash(Exception):
    pass


def test_commit_and_read_back_across_index_granules(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    new_stream(e, "a", 1)
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.randint(1, 3000)) for _ in range(300)]
    for i in range(0, len(payloads), 10):
        e.commit([Append(1, KIND_BYTES, payloads[i : i + 10])])
    data = b"".join(payloads)
    assert e.tails[1].unit == len(data)
    assert e.tails[1].file_len > 20 * INDEX_GRANULARITY
    # Every position, from a fresh index lookup and in small chunks.
    for start in [0, 1, 2999, 40_000, len(data) // 2, len(data) - 1]:
        got, nxt, _ = e.read(1, KIND_BYTES, start, len(data), 5000)
        assert b"".join(got) == data[start : start + 5000]
        assert nxt == min(len(data), start + 5000)
    assert read_all(e, 1, KIND_BYTES, 0, len(data), 777) == data
    e.close()


def test_json_reads_return_whole_messages(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    new_stream(e, "j", 1, KIND_JSON)
    msgs = [b'{"i":%d,"pad":"%s"}' % (i, b"x" * (i % 50)) for i in range(500)]
    e.commit([Append(1, KIND_JSON, msgs)])
    got, nxt, _ = e.read(1, KIND_JSON, 100, 500, 200)
    assert got == msgs[100 : 100 + len(got)] and nxt == 100 + len(got)
    assert sum(map(len, got)) <= 200 or len(got) == 1
    got, nxt, _ = e.read(1, KIND_JSON, 499, 500, 1)
    assert got == [msgs[499]] and nxt == 500  # at least one message, whatever the limit
    e.close()


def test_restart_after_clean_close_keeps_everything(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    new_stream(e, "a", 1)
    e.commit(
        [Append(1, KIND_BYTES, [b"abc", b"def"], Producer("p", 0, 0)), PutProducer(1, "p", 0, 0)]
    )
    e.close()
    e2 = Engine(tmp_path / "d")
    state, report = e2.open()
    assert report.wal_frames_replayed == 0  # the final checkpoint emptied the WAL
    assert state.streams == 1 and state.tails[1].unit == 6
    stored = e2.stored_stream("a")
    assert stored is not None and stored[0].id == 1 and stored[1] == {"p": (0, 0)}
    assert read_all(e2, 1, KIND_BYTES, 0, 6) == b"abcdef"
    e2.close()


def test_wal_replay_restores_writes_the_segment_files_lost(tmp_path):
    e = Engine(tmp_path / "d", inline_max=0)
    e.open()
    new_stream(e, "a", 1)
    e.commit([Append(1, KIND_BYTES, [b"durable"])])
    seg = e.layout.segment_path(1)
    crash(e)
    os.truncate(seg, 0)  # as if the page cache never reached the disk
    e2 = Engine(tmp_path / "d", inline_max=0)
    _, report = e2.open()
    assert report.wal_frames_replayed == 2
    assert read_all(e2, 1, KIND_BYTES, 0, 7) == b"durable"
    e2.close()


@pytest.mark.parametrize(
    ("stage", "survives"), [("segments", False), ("wal", True), ("commit", True)]
)
def test_crash_between_the_steps_of_a_batch(tmp_path, stage, survives):
    """Each window of a batch: before the WAL flush the batch is gone whole;
    after it, the batch is there whole, even if LMDB never committed."""
    armed = {"stage": None}

    def hook(s: str) -> None:
        if s == armed["stage"]:
            raise Crash(s)

    e = Engine(tmp_path / "d", fault_hook=hook, inline_max=0)
    e.open()
    new_stream(e, "a", 1)
    e.commit([Append(1, KIND_BYTES, [b"before;"])])
    armed["stage"] = stage
    with pytest.raises(Crash):
        e.commit([Append(1, KIND_BYTES, [b"maybe;"]), PutProducer(1, "p", 0, 5)])
    crash(e)
    e2 = Engine(tmp_path / "d", inline_max=0)
    e2.open()
    expected = b"before;maybe;" if survives else b"before;"
    assert e2.tails[1].unit == len(expected)
    assert read_all(e2, 1, KIND_BYTES, 0, len(expected)) == expected
    stored = e2.stored_stream("a")
    assert stored is not None and (stored[1].get("p") == (0, 5)) is survives
    assert os.path.getsize(e2.layout.segment_path(1)) == e2.tails[1].file_len
    e2.close()


def test_delete_removes_files_and_orphans_are_collected(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    new_stream(e, "a", 1)
    new_stream(e, "b", 2)
    e.commit([Append(2, KIND_BYTES, [b"x"])])
    e.commit([DeleteStream("a"), DropLog(1)])
    assert not e.layout.segment_path(1).exists()
    orphan = e.layout.segment_path(99)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"left over from a crash")
    e.close()
    e2 = Engine(tmp_path / "d")
    state, report = e2.open()
    assert state.streams == 1 and list(e2.stored_paths()) == ["b"]
    assert report.orphan_files_removed == 1 and not orphan.exists()
    e2.close()


def test_corrupt_record_in_the_middle_is_reported_not_served(tmp_path):
    e = Engine(tmp_path / "d", inline_max=0)
    e.open()
    new_stream(e, "a", 1)
    e.commit([Append(1, KIND_BYTES, [b"A" * 100])])
    e.commit([Append(1, KIND_BYTES, [b"B" * 100])])
    e.close()
    seg = Layout(tmp_path / "d").segment_path(1)
    raw = bytearray(seg.read_bytes())
    raw[60] ^= 0xFF  # inside the first record's payload
    seg.write_bytes(bytes(raw))
    e2 = Engine(tmp_path / "d", inline_max=0)
    e2.open()
    from stream_server.engine import DamagedStream

    with pytest.raises(DamagedStream):
        e2.read(1, KIND_BYTES, 0, 200, 1000)
    e2.close()


def test_layout_refuses_foreign_and_future_directories(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "important.txt").write_text("not ours")
    with pytest.raises(LayoutError, match="not empty"):
        prepare(Layout(foreign))
    future = tmp_path / "future"
    future.mkdir()
    (future / "FORMAT").write_text("durable-streams-py data format 99\n")
    with pytest.raises(LayoutError, match="not supported"):
        prepare(Layout(future))


def test_checkpoint_rotates_and_deletes_old_wal(tmp_path):
    e = Engine(tmp_path / "d", checkpoint_bytes=4096)
    e.open()
    new_stream(e, "a", 1)
    for _ in range(10):
        e.commit([Append(1, KIND_BYTES, [b"z" * 1000])])
    e._checkpoint_thread.join()
    numbers = [int(p.stem) for p in (tmp_path / "d" / "wal").glob("*.wal")]
    assert min(numbers) > 1  # the first WAL file was checkpointed away
    crash(e)
    e2 = Engine(tmp_path / "d")
    e2.open()
    assert read_all(e2, 1, KIND_BYTES, 0, 10_000) == b"z" * 10_000
    e2.close()


class FlushLog:
    """An fsio recorder: the disk-changing calls in the order they succeeded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: list[tuple] = []
        self.threads: set[str] = set()  # the threads that flushed segment files

    def record(self, op: tuple) -> None:
        with self.lock:
            self.ops.append(op)
            if op[0] == "fsync":
                self.threads.add(threading.current_thread().name)


def test_a_clean_stop_flushes_every_written_stream_on_threads_before_the_wal_goes(tmp_path):
    """The stop's checkpoint flushes segment files on several threads: every file
    written since the last checkpoint is flushed, and all of them before the
    directories, LMDB and the WAL's deletion."""
    e = Engine(tmp_path / "d", inline_max=0)
    e.open()
    count = 5 * fsio.FLUSH_WORKERS  # more files than threads: every thread flushes several
    for sid in range(1, count + 1):
        new_stream(e, f"s{sid}", sid)
        e.commit([Append(sid, KIND_BYTES, [b"x" * 100])])
    paths = {str(e.segments.path(sid)) for sid in range(1, count + 1)}
    log = FlushLog()
    fsio.attach(log)
    try:
        e.close()
    finally:
        fsio.attach(None)
    kinds = [op[0] for op in log.ops]
    flushed = [str(op[1]) for op in log.ops if op[0] == "fsync"]
    assert set(flushed) == paths and len(flushed) == count  # each once
    assert len(log.threads) > 1 and all(t.startswith("flush") for t in log.threads)
    last_flush = max(i for i, k in enumerate(kinds) if k == "fsync")
    assert last_flush < kinds.index("fsync_dir") < kinds.index("unlink")
    e2 = Engine(tmp_path / "d", inline_max=0)
    _, report = e2.open()
    assert report.wal_frames_replayed == 0
    assert all(read_all(e2, sid, KIND_BYTES, 0, 100) == b"x" * 100 for sid in range(1, count + 1))
    e2.close()


def test_lmdb_map_full_grows_the_map(tmp_path):
    e = Engine(tmp_path / "d", map_size=256 * 1024)
    e.open()
    before = e.meta.env.info()["map_size"]
    for i in range(1, 400):
        new_stream(e, f"s/{i}/" + "x" * 200, i)
    assert e.meta.env.info()["map_size"] > before
    e.close()
    e2 = Engine(tmp_path / "d", map_size=256 * 1024)
    state, _ = e2.open()
    assert state.streams == 399 == e2.stored_stream_count() == len(list(e2.stored_paths(batch=7)))
    e2.close()


def test_a_file_shorter_than_its_tail_recovers_to_the_last_whole_record(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    new_stream(e, "a", 1)
    payloads = [bytes([65 + i % 26]) * 3000 for i in range(40)]  # crosses index granules
    e.commit([Append(1, KIND_BYTES, payloads)])
    e.close()
    seg = Layout(tmp_path / "d").segment_path(1)
    os.truncate(seg, seg.stat().st_size - 100)  # the last record loses its end
    e2 = Engine(tmp_path / "d")
    _, report = e2.open()
    assert report.truncated_streams == 1
    whole = b"".join(payloads[:-1])
    assert e2.tails[1].unit == len(whole)
    assert read_all(e2, 1, KIND_BYTES, 0, len(whole)) == whole
    e2.commit([Append(1, KIND_BYTES, [b"after"])])  # and it takes appends at the new tail
    assert read_all(e2, 1, KIND_BYTES, len(whole), len(whole) + 5) == b"after"
    e2.close()
