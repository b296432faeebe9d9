"""Keyed values (``PutKeyedValue``/``DeleteKeyedValue``, data format 3): durable with their
batch, replayed from the WAL when LMDB lost its last commits, kept apart by space,
and refused, changing nothing, when a name or a value cannot be stored."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stream_format import wal
from stream_format.meta import DB_RECORDS, MAX_KEY_BYTES, space_key
from stream_server.engine import Engine, StorageFailed
from stream_server.engine.batch import build
from stream_server.engine.ops import DeleteKeyedValue, PutKeyedValue
from stream_server.streams.errors import BadRequest, Unavailable
from stream_server.streams.keyed_values import MAX_KEYED_VALUE_BYTES
from stream_server.streams.store import AppendRequest, CreateRequest, StoreLimits, StreamStore
from testkit.crashstates import KeyedValueHistory, Recording
from testkit.engines import crash
from testkit.spark_rows import every_stream

pytestmark = pytest.mark.processes

BIN = "application/octet-stream"


def test_keyed_value_ops_become_puts_and_deletes_of_the_records_database():
    batch = build(
        [
            PutKeyedValue("subs", "a", b"{}"),
            DeleteKeyedValue("subs", "b"),
            PutKeyedValue("x", "a\x00b", b""),
        ],
        {},
        now_us=1,
    )
    assert batch.changes == [
        (wal.PUT, DB_RECORDS, b"subs\x00a", b"{}"),
        (wal.DELETE, DB_RECORDS, b"subs\x00b"),
        (wal.PUT, DB_RECORDS, b"x\x00a\x00b", b""),
    ]
    assert batch.writes == {} and batch.tails == {}


def test_keyed_values_lost_by_lmdb_are_replayed_from_the_wal(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    e.commit([PutKeyedValue("subs", "keep", b"v1"), PutKeyedValue("subs", "gone", b"x")])
    mdb = e.layout.meta / "data.mdb"
    before = mdb.read_bytes()  # LMDB as of the first batch
    e.commit([PutKeyedValue("subs", "keep", b"v2"), DeleteKeyedValue("subs", "gone")])
    e.commit([PutKeyedValue("subs", "new", b"n"), PutKeyedValue("other", "keep", b"o")])
    crash(e)
    mdb.write_bytes(before)  # LMDB lost its last two commits; the WAL has them
    e2 = Engine(tmp_path / "d")
    _, report = e2.open()
    assert report.wal_frames_replayed == 3
    assert e2.keyed_values("subs") == {"keep": b"v2", "new": b"n"}
    assert e2.keyed_values("other") == {"keep": b"o"}
    e2.close()
    e3 = Engine(tmp_path / "d")  # and after a clean shutdown (checkpoint, empty WAL)
    _, report = e3.open()
    assert report.wal_frames_replayed == 0
    assert e3.keyed_values("subs") == {"keep": b"v2", "new": b"n"}
    e3.close()


def test_spaces_that_share_a_prefix_never_see_each_others_values(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    e.commit(
        [
            PutKeyedValue("sub", "k", b"1"),
            PutKeyedValue("subs", "k", b"2"),
            PutKeyedValue("sub", "\x00k", b"3"),  # a key may hold NUL: the space may not
            PutKeyedValue("su", "bk", b"4"),
        ]
    )
    assert e.keyed_values("sub") == {"k": b"1", "\x00k": b"3"}
    assert e.keyed_values("subs") == {"k": b"2"}
    assert e.keyed_values("su") == {"bk": b"4"}
    assert e.keyed_values("s") == {}
    e.close()


async def _store(data_dir: Path, **kw: object) -> StreamStore:
    store = StreamStore(data_dir, limits=StoreLimits(sweep_interval=3600), **kw)  # type: ignore[arg-type]
    await store.start()
    return store


@pytest.mark.parametrize(
    ("space", "key", "value", "message"),
    [
        ("", "k", b"v", "the space of a keyed value is empty"),
        ("a\x00b", "k", b"v", "contains a NUL character"),
        ("s", "", b"v", "the key of a keyed value is empty"),
        ("s", "\ud800", b"v", "is not valid Unicode text"),
        ("s" * MAX_KEY_BYTES, "k", b"v", "the space of a keyed value is longer than 510 bytes"),
        ("s" * 300, "k" * 211, b"v", "together are 511 bytes"),
        ("s", "k", "text", "a keyed value must be bytes, not str"),
        ("s", 7, b"v", "the key of a keyed value must be a string, not int"),
        ("s", "k", b"v" * (MAX_KEYED_VALUE_BYTES + 1), "more than 16777216"),
    ],
)
def test_a_keyed_value_that_cannot_be_stored_is_refused_and_changes_nothing(
    tmp_path, space, key, value, message
):
    async def go() -> None:
        store = await _store(tmp_path / "d")
        try:
            await store.put_keyed_value("s", "k", b"before")
            lsn = store.engine.lsn
            with pytest.raises(BadRequest, match=message):
                await store.put_keyed_value(space, key, value)
            assert store.engine.lsn == lsn  # no batch was written
            assert store.keyed_values("s") == {"k": b"before"}
        finally:
            await store.stop()

    asyncio.run(go())


def test_the_longest_space_and_key_fit_an_lmdb_key(tmp_path):
    async def go() -> None:
        store = await _store(tmp_path / "d")
        try:
            space, key = "s" * 300, "é" * 105  # 300 + 1 + 210 = 511 bytes
            assert len(space_key(space, key)) == MAX_KEY_BYTES
            await store.put_keyed_value(space, key, b"v")
            assert store.keyed_values(space) == {key: b"v"}
            with pytest.raises(BadRequest, match="NUL"):
                store.keyed_values("a\x00")
        finally:
            await store.stop()

    asyncio.run(go())


def test_keyed_values_put_with_appends_in_one_batch_are_all_there_after_a_restart(tmp_path):
    async def go() -> None:
        store = await _store(tmp_path / "d")
        await store.create(CreateRequest("s", BIN))
        # Submitted together: they share batches with the appends; the last put wins.
        await asyncio.gather(
            *(store.append(AppendRequest("s", BIN, b"x")) for _ in range(20)),
            *(store.put_keyed_value("subs", f"k{i % 5}", b"%d" % i) for i in range(20)),
            store.put_keyed_value("subs", "k4", None),
        )
        assert store.keyed_values("subs") == {f"k{i}": b"%d" % (15 + i) for i in range(4)}
        await store.stop()
        store = await _store(tmp_path / "d")
        assert store.keyed_values("subs") == {f"k{i}": b"%d" % (15 + i) for i in range(4)}
        assert store.get("s").tail == 20
        await store.stop()

    asyncio.run(go())


def test_a_keyed_value_whose_batch_fails_is_not_stored_and_the_caller_hears_so(tmp_path):
    fail = {"on": False}

    def hook(stage: str) -> None:
        if stage == "segments" and fail["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")

    async def go() -> None:
        store = await _store(tmp_path / "d", engine=Engine(tmp_path / "d", fault_hook=hook))
        try:
            await store.put_keyed_value("subs", "a", b"1")
            fail["on"] = True
            with pytest.raises(Unavailable) as err:
                await store.put_keyed_value("subs", "a", b"2")
            assert err.value.disk_full
            assert store.keyed_values("subs") == {"a": b"1"}
            fail["on"] = False
            await store.put_keyed_value("subs", "a", None)
            assert store.keyed_values("subs") == {}
        finally:
            await store.stop()

    asyncio.run(go())
    e = Engine(tmp_path / "d")
    e.open()
    assert e.keyed_values("subs") == {}
    e.close()


def test_put_keyed_value_on_a_store_that_is_not_running_says_so(tmp_path):
    async def go() -> None:
        store = StreamStore(tmp_path / "d")
        with pytest.raises(Unavailable, match="not running"):
            await store.put_keyed_value("subs", "a", b"1")
        with pytest.raises(Unavailable, match="not open"):
            store.keyed_values("subs")

    asyncio.run(go())


def test_a_put_after_the_store_stopped_fails_at_once_instead_of_waiting_forever(tmp_path):
    """Once the writer thread is told to end, nothing would carry out a submitted batch:
    the pipeline fails it at once (it used to queue it behind the end, for ever)."""

    async def go() -> None:
        store = await _store(tmp_path / "d")
        await store.put_keyed_value("subs", "a", b"1")
        await store.stop()
        with pytest.raises(Unavailable, match="not running"):
            await store.put_keyed_value("subs", "a", b"2")
        fut = store.pipeline.submit([PutKeyedValue("subs", "a", b"3")])
        assert fut.done() and isinstance(fut.exception(), StorageFailed)

    asyncio.run(go())


def test_the_spark_reader_ignores_the_records_database(tmp_path):
    async def go() -> None:
        store = await _store(tmp_path / "d")
        await store.create(CreateRequest("s", BIN, b"data"))
        await store.put_keyed_value("subs", "a", b"1")
        await store.stop()

    asyncio.run(go())
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "d", copy)
    rows, is_json = every_stream(copy)
    assert {p: b"".join(r) for p, r in rows.items()} == {"s": b"data"} and is_json == {"s": False}


CHILD = """
import asyncio, sys
from pathlib import Path
from stream_server.streams.store import StoreLimits, StreamStore

async def main(data):
    store = StreamStore(Path(data), limits=StoreLimits(sweep_interval=3600))
    await store.start()
    n = 0
    while True:  # until killed: five puts submitted together, then their acks
        batch = [(f"k{(n + i) % 7}", n + i) for i in range(5)]
        n += 5
        await asyncio.gather(
            *(store.put_keyed_value("subs", k, b"%d" % v if v % 11 else None) for k, v in batch)
        )
        print(" ".join(f"{k}={v}" for k, v in batch), flush=True)

asyncio.run(main(sys.argv[1]))
"""


def test_keyed_values_acknowledged_before_a_kill_9_are_there_after_it(tmp_path):
    """A real process killed with SIGKILL while it puts and deletes keyed values: each key
    holds its last acknowledged change, or a change of the round in flight."""
    data = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(60)]  # 300 changes acknowledged
    assert all(lines), "the writer died on its own"
    os.kill(proc.pid, signal.SIGKILL)
    lines.append(proc.stdout.read())  # every line the writer printed before it died
    proc.wait()
    acked: dict[str, int] = {}
    for item in " ".join(lines).split():
        k, v = item.split("=")
        acked[k] = int(v)
    last = max(acked.values())  # the round after it was in flight, at most
    e = Engine(data)
    e.open()
    got = e.keyed_values("subs")
    e.close()

    def state(v: int) -> bytes | None:
        return None if v % 11 == 0 else b"%d" % v

    for i in range(7):
        k = f"k{i}"
        allowed = [state(acked[k])] + [state(v) for v in range(last + 1, last + 6) if v % 7 == i]
        assert got.get(k) in allowed, f"{k}: recovered {got.get(k)!r}, allowed {allowed}"


def test_keyed_history_allows_exactly_the_prefixes_that_hold_every_acknowledged_change(
    tmp_path,
):
    """The crash-state check itself (``testkit.crashstates.KeyedValueHistory``)."""
    rec = Recording(tmp_path)
    h = KeyedValueHistory()
    h.ack(rec, h.submit("k", b"1"))  # acknowledged at place 0
    second = h.submit("k", b"2")
    h.submit("j", b"x")  # never acknowledged
    h.ack(rec, second)  # at place 1
    assert h.check(1, {"k": b"1"}) == 1  # a crash after place 0: the second in flight
    assert h.check(1, {"k": b"2"}) == 2
    assert h.check(1, {"k": b"2", "j": b"x"}) == 3
    for bad in ({}, {"k": b"1", "j": b"x"}, {"j": b"x"}):  # lost, or not a prefix
        with pytest.raises(AssertionError, match="no prefix"):
            h.check(1, bad)
    with pytest.raises(AssertionError, match=r"differs in \{'k': \"b'1' \(acknowledged: b'2'\)"):
        h.check(2, {"k": b"1"})  # the second was acknowledged before this crash
    assert h.check(0, {}) == 0
