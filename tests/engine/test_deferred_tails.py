"""Tails that wait for the next batch's LMDB transaction (``engine/meta_writes.py``).

A batch that changes only tails, with another batch behind it, leaves them to a
later transaction: LMDB is then behind the WAL by a few frames, never by more than
``MAX_DEFERRED``, never in a retained start, and never once the load stops. These
tests read LMDB itself (what a worker, the Spark reader or a copy sees) beside what
the engine serves, and crash the engine with tails waiting.
"""

from __future__ import annotations

from pathlib import Path

from stream_format.meta import DB_TAILS, decode_tail, id_key
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.meta_writes import MAX_DEFERRED
from stream_server.engine.ops import Append, PutProducer
from testkit.engines import crash, new_stream, read_all, settled


def behind() -> bool:
    return True


def lmdb_unit(e: Engine, sid: int) -> int:
    """The stream's tail as LMDB has it (what a reader from outside sees)."""
    assert e.meta is not None
    with e.meta.env.begin() as txn:
        raw = txn.get(id_key(sid), db=e.meta.dbs[DB_TAILS])
    assert raw is not None
    return decode_tail(bytes(raw)).unit


def engine_with_streams(root: Path, **kw: int) -> Engine:
    e = Engine(root, inline_max=0, **kw)  # files only: an inline log is never deferred
    e.open()
    new_stream(e, "a", 1)
    new_stream(e, "b", 2)
    return e


def test_a_batch_of_tails_with_one_behind_it_leaves_them_to_that_ones_transaction(tmp_path):
    e = engine_with_streams(tmp_path / "d")
    committed = e.lsn
    e.commit([Append(1, KIND_BYTES, [b"first"])], behind)
    # Durable and served, not yet in LMDB.
    assert e.tails[1].unit == 5 and read_all(e, 1, KIND_BYTES, 0, 5) == b"first"
    assert lmdb_unit(e, 1) == 0
    assert (e.meta_lsn, e.lsn) == (committed, committed + 1)
    e.commit([Append(2, KIND_BYTES, [b"second"])])  # nothing behind it: it commits both
    assert (lmdb_unit(e, 1), lmdb_unit(e, 2)) == (5, 6)
    assert e.meta_lsn == e.lsn
    e.close()


def test_a_batch_that_changes_more_than_tails_commits_at_once_with_what_waits(tmp_path):
    e = engine_with_streams(tmp_path / "d")
    e.commit([Append(1, KIND_BYTES, [b"x" * 10])], behind)
    assert lmdb_unit(e, 1) == 0
    e.commit([Append(2, KIND_BYTES, [b"y"]), PutProducer(2, "p", 0, 0)], behind)
    assert (lmdb_unit(e, 1), lmdb_unit(e, 2)) == (10, 1)
    assert e.meta_lsn == e.lsn
    stored = e.stored_stream("b")
    assert stored is not None and stored[1] == {"p": (0, 0)}
    e.close()


def test_no_more_than_max_deferred_batches_wait_in_a_row(tmp_path):
    e = engine_with_streams(tmp_path / "d")
    for n in range(1, MAX_DEFERRED + 1):
        e.commit([Append(1, KIND_BYTES, [b"z"])], behind)
        assert lmdb_unit(e, 1) == 0, n
    e.commit([Append(1, KIND_BYTES, [b"z"])], behind)  # one more: it commits them all
    assert lmdb_unit(e, 1) == MAX_DEFERRED + 1 and e.meta_lsn == e.lsn
    e.commit([Append(1, KIND_BYTES, [b"z"])], behind)  # and the count starts again
    assert lmdb_unit(e, 1) == MAX_DEFERRED + 1
    e.close()


def test_tails_waiting_at_a_crash_come_back_from_the_wal(tmp_path):
    e = engine_with_streams(tmp_path / "d")
    for i in range(5):
        e.commit([Append(1 + i % 2, KIND_BYTES, [bytes([65 + i]) * 100])], behind)
    assert lmdb_unit(e, 1) == 0 and lmdb_unit(e, 2) == 0
    crash(e)
    e2 = Engine(tmp_path / "d", inline_max=0)
    state, report = e2.open()
    assert report.wal_frames_replayed > 5
    assert (state.tails[1].unit, state.tails[2].unit) == (300, 200)
    assert read_all(e2, 1, KIND_BYTES, 0, 300) == b"A" * 100 + b"C" * 100 + b"E" * 100
    assert (lmdb_unit(e2, 1), lmdb_unit(e2, 2)) == (300, 200)  # replayed into LMDB
    e2.close()


def test_a_checkpoint_commits_what_waits_before_the_wal_files_go(tmp_path):
    e = engine_with_streams(tmp_path / "d", checkpoint_frames=4)
    first = e.wal.number if e.wal else 0
    e.commit([Append(1, KIND_BYTES, [b"q" * 7])], behind)  # frame 3, waits
    e.commit([Append(1, KIND_BYTES, [b"q" * 7])], behind)  # frame 4: a checkpoint is due
    settled(e)
    assert e.wal is not None and e.wal.number > first  # the WAL rotated
    assert lmdb_unit(e, 1) == 14  # LMDB holds what the deleted files held
    crash(e)
    e2 = Engine(tmp_path / "d", inline_max=0)
    state, _ = e2.open()
    assert state.tails[1].unit == 14
    e2.close()


def test_a_clean_stop_commits_what_waits(tmp_path):
    e = engine_with_streams(tmp_path / "d")
    e.commit([Append(2, KIND_BYTES, [b"kept"])], behind)
    e.close()
    e2 = Engine(tmp_path / "d", inline_max=0)
    state, report = e2.open()
    assert report.wal_frames_replayed == 0 and state.tails[2].unit == 4
    assert lmdb_unit(e2, 2) == 4
    e2.close()
