"""The engine's LMDB writer alone (``engine/meta_writes.py``), over a real LMDB
environment and no engine: which batches may leave their tails for a later
transaction, that the next transaction takes them first, and how a failed commit of
what waits fails closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_format import wal as walmod
from stream_format.meta import DB_INFO, DB_STREAMS, DB_TAILS, encode_tail_fields, id_key
from stream_server.engine.batch import Batch
from stream_server.engine.fail_closed import FailClosed
from stream_server.engine.meta_writes import MAX_DEFERRED, MetaWriter
from stream_server.engine.metadata import Metadata


def tail_put(sid: int, unit: int) -> walmod.Entry:
    return (walmod.PUT, DB_TAILS, id_key(sid), encode_tail_fields(16 + unit, unit, 0, 0, 16))


def tails_only(*entries: walmod.Entry, heads: dict[int, int] | None = None) -> Batch:
    return Batch(writes={}, changes=list(entries), tails={}, dropped=[], heads=heads or {})


def lmdb_get(meta: Metadata, db: int, key: bytes) -> bytes | None:
    with meta.env.begin() as txn:
        raw = txn.get(key, db=meta.dbs[db])
        return None if raw is None else bytes(raw)


@pytest.fixture
def writer(tmp_path: Path) -> MetaWriter:
    return MetaWriter(Metadata(tmp_path / "meta", 1 << 20), FailClosed())


def test_only_a_batch_of_tails_with_one_behind_it_may_wait(writer):
    asked: list[bool] = []

    def behind() -> bool:
        asked.append(True)
        return True

    assert writer.deferrable(tails_only(tail_put(1, 5)), behind)
    assert not writer.deferrable(tails_only(tail_put(1, 5)), None)  # nothing behind
    assert not writer.deferrable(tails_only(tail_put(1, 5)), lambda: False)
    asked.clear()
    other = (walmod.PUT, DB_STREAMS, b"a", b"{}")
    assert not writer.deferrable(tails_only(tail_put(1, 5), other), behind)
    assert not writer.deferrable(tails_only(tail_put(1, 5), heads={1: 4096}), behind)
    assert not writer.deferrable(tails_only((walmod.DELETE, DB_TAILS, id_key(1))), behind)
    assert asked == []  # the other thread's state is asked last, only when all else allows


def test_at_most_max_deferred_batches_wait_in_a_row(writer):
    for n in range(MAX_DEFERRED):
        assert writer.deferrable(tails_only(tail_put(1, n)), lambda: True), n
        writer.defer([tail_put(1, n)])
    assert writer.waiting == MAX_DEFERRED
    assert not writer.deferrable(tails_only(tail_put(1, 99)), lambda: True)


def test_the_next_transaction_puts_the_newest_waiting_tail_before_its_own_changes(writer):
    writer.defer([tail_put(1, 5), tail_put(2, 7)])
    writer.defer([tail_put(1, 9)])
    assert lmdb_get(writer.meta, DB_TAILS, id_key(1)) is None  # still waiting
    writer.write([tail_put(2, 8), (walmod.PUT, DB_INFO, b"k", b"v")])
    assert lmdb_get(writer.meta, DB_TAILS, id_key(1)) == tail_put(1, 9)[3]
    assert lmdb_get(writer.meta, DB_TAILS, id_key(2)) == tail_put(2, 8)[3]  # its own, last
    assert writer.waiting == 0


def test_committing_what_waits_moves_the_lmdb_position(writer):
    assert writer.commit_deferred(3)  # nothing waits: nothing to do
    assert writer.meta_lsn == 0
    writer.defer([tail_put(1, 5)])
    assert writer.commit_deferred(4)
    assert writer.meta_lsn == 4 and writer.waiting == 0
    assert lmdb_get(writer.meta, DB_TAILS, id_key(1)) == tail_put(1, 5)[3]


def test_a_failed_commit_of_what_waits_fails_closed_and_keeps_the_position(writer):
    writer.defer([tail_put(1, 5)])
    writer.meta.close()  # any later transaction fails
    assert not writer.commit_deferred(4)
    assert writer.meta_lsn == 0
    assert writer.faults.failed is not None and "tails that waited" in writer.faults.failed


def test_a_full_map_is_grown_and_the_transaction_retried(tmp_path):
    writer = MetaWriter(Metadata(tmp_path / "meta", 64 * 1024), FailClosed())
    big = b"x" * (1 << 20)
    writer.write([(walmod.PUT, DB_INFO, b"big", big)], flush=True)
    assert lmdb_get(writer.meta, DB_INFO, b"big") == big
    assert writer.meta.env.info()["map_size"] > 1 << 20
