"""Stream rules over a real engine in a temporary data directory."""

from __future__ import annotations

import pytest

from stream_server.declared.network import LimitsSettings
from stream_server.engine import StorageError
from stream_server.streams.clock import ManualClock
from stream_server.streams.errors import (
    BadRequest,
    Conflict,
    Gone,
    NotFound,
    ProducerFenced,
    SequenceGap,
    StreamClosed,
    Unavailable,
)
from stream_server.streams.store import (
    AppendRequest,
    CreateRequest,
    ForkRequest,
    Producer,
    StoreLimits,
    StreamStore,
)

BIN = "application/octet-stream"
JSON = "application/json"


async def read_all(store: StreamStore, path: str) -> bytes:
    s = store.get(path)
    r = await store.read(s, 0, 1 << 30)
    return b"".join(r.payloads)


async def append(store, path, body, ct=BIN, **kw):
    return await store.append(AppendRequest(path, ct, body, **kw))


async def test_create_is_idempotent_only_with_the_same_configuration(store):
    r = await store.create(CreateRequest("s", BIN, b"abc"))
    assert r.created and r.tail == 3
    again = await store.create(CreateRequest("s", "APPLICATION/OCTET-STREAM"))
    assert not again.created and again.tail == 3
    for req in [
        CreateRequest("s", "text/plain"),
        CreateRequest("s", BIN, ttl=5),
        CreateRequest("s", BIN, closed=True),
    ]:
        with pytest.raises(Conflict):
            await store.create(req)


async def test_json_appends_flatten_one_level_and_validate(store):
    await store.create(CreateRequest("j", JSON, b"[]"))
    await append(store, "j", b'[{"a":1},[2,3]]', JSON)
    await append(store, "j", b'"x"', JSON)
    s = store.get("j")
    assert s.tail == 3
    r = await store.read(s, 0, 1 << 20)
    assert r.payloads == [b'{"a":1}', b"[2,3]", b'"x"']
    for bad in [b"[]", b"{nope", b""]:
        with pytest.raises(BadRequest):
            await append(store, "j", bad, JSON)
    assert store.get("j").tail == 3


async def test_producer_rules(store):
    await store.create(CreateRequest("p", BIN))

    def prod(epoch, seq):
        return Producer("w", epoch, seq)

    with pytest.raises(SequenceGap):  # a new producer starts at 0
        await append(store, "p", b"x", producer=prod(0, 1))
    r = await append(store, "p", b"a", producer=prod(0, 0))
    assert r.appended and not r.duplicate
    dup = await append(store, "p", b"a", producer=prod(0, 0))
    assert dup.duplicate and not dup.appended
    with pytest.raises(SequenceGap) as gap:
        await append(store, "p", b"c", producer=prod(0, 2))
    assert (gap.value.expected, gap.value.received) == (1, 2)
    with pytest.raises(BadRequest):  # a new epoch must start at 0
        await append(store, "p", b"c", producer=prod(1, 1))
    await append(store, "p", b"b", producer=prod(1, 0))
    with pytest.raises(ProducerFenced) as fenced:
        await append(store, "p", b"zombie", producer=prod(0, 1))
    assert fenced.value.current_epoch == 1
    assert await read_all(store, "p") == b"ab"


async def test_closing_is_final_and_idempotent(store):
    await store.create(CreateRequest("c", BIN, b"data"))
    r = await append(store, "c", b"", close=True)
    assert r.closed and r.tail == 4
    again = await append(store, "c", b"", close=True)
    assert again.closed
    with pytest.raises(StreamClosed) as closed:
        await append(store, "c", b"more")
    assert closed.value.final_unit == 4


async def test_stream_seq_must_increase(store):
    await store.create(CreateRequest("q", BIN))
    await append(store, "q", b"1", stream_seq="a")
    with pytest.raises(Conflict):
        await append(store, "q", b"2", stream_seq="a")
    await append(store, "q", b"3", stream_seq="b")
    assert await read_all(store, "q") == b"13"


async def test_forks_stitch_and_deletion_cascades(store):
    await store.create(CreateRequest("a", BIN, b"0123456789"))
    await store.create(CreateRequest("b", None, fork=ForkRequest("a", 4)))
    await append(store, "b", b"BB")
    await append(store, "a", b"AA")  # after the fork point: not visible in b
    await store.create(CreateRequest("c", None, fork=ForkRequest("b", None)))
    await append(store, "c", b"C")
    assert await read_all(store, "b") == b"0123BB"
    assert await read_all(store, "c") == b"0123BBC"
    await store.delete("a")
    with pytest.raises(Gone):
        store.get("a")
    with pytest.raises(Conflict):
        await store.create(CreateRequest("a", BIN))
    await store.delete("b")
    assert await read_all(store, "c") == b"0123BBC"  # reads through two deleted sources
    await store.delete("c")
    assert set(store.streams) == set()  # the cascade removed a and b
    await store.create(CreateRequest("a", BIN))


async def test_fork_sub_offset_stays_within_one_record(store):
    await store.create(CreateRequest("src", BIN, b"hello"))
    await append(store, "src", b"world")
    await store.create(CreateRequest("f", None, fork=ForkRequest("src", 0, 3)))
    assert await read_all(store, "f") == b"hel"
    with pytest.raises(BadRequest):
        await store.create(CreateRequest("g", None, fork=ForkRequest("src", 0, 6)))
    with pytest.raises(BadRequest):
        await store.create(CreateRequest("h", None, fork=ForkRequest("src", 11)))


@pytest.fixture
async def clocked(tmp_path):
    """A store whose clock moves only when the test moves it (no TTL is waited out)."""
    clock = ManualClock()
    s = StreamStore(tmp_path / "data", clock=clock, limits=StoreLimits(sweep_interval=3600))
    await s.start()
    yield s, clock
    await s.stop()


async def test_expired_streams_are_gone(clocked):
    store, clock = clocked
    await store.create(CreateRequest("t", BIN, b"x", ttl=60))
    clock.advance(59)
    store.get("t", touch=True)  # a read renews the TTL
    clock.advance(59)
    assert store.get("t").path == "t"
    clock.advance(2)
    with pytest.raises(NotFound):
        store.get("t")


async def test_the_sweeper_expires_what_has_passed_by_the_store_s_clock(clocked):
    store, clock = clocked
    await store.create(CreateRequest("ttl", BIN, b"x", ttl=60))
    at = clock.now + 30
    await store.create(CreateRequest("at", BIN, b"y", expires_at="soon", expires_at_ts=at))
    await store.create(CreateRequest("kept", BIN, b"z"))
    assert store.sweep() == 0
    clock.advance(31)
    assert store.sweep() == 1  # "at"
    await store.expiry.drained()
    clock.advance(30)
    assert store.sweep() == 1  # "ttl"
    await store.expiry.drained()
    assert sorted(store.streams) == ["kept"]
    with pytest.raises(NotFound):  # a fork of an expired source: its source is gone
        await store.create(CreateRequest("f", None, fork=ForkRequest("ttl", None)))


async def test_a_store_that_paused_its_own_writes_deletes_nothing_until_resumed(clocked):
    """A standby's store: an expired stream reads as gone, but neither the read nor the
    sweeper deletes it (the primary's delete is to come as a frame); once primary, the
    sweeper does."""
    store, clock = clocked
    await store.create(CreateRequest("t", BIN, b"x", ttl=60))
    store.pause_own_writes()
    clock.advance(61)
    with pytest.raises(NotFound):
        store.get("t")
    store.sweep()
    await store.expiry.drained()
    assert "t" in store.streams and not store.streams["t"].pending.meta.soft_deleted
    store.resume_own_writes()
    store.sweep()
    await store.expiry.drained()
    assert "t" not in store.streams


async def test_a_failed_batch_changes_nothing(store, monkeypatch):
    await store.create(CreateRequest("f", BIN, b"keep"))
    await append(store, "f", b"1", producer=Producer("w", 0, 0))
    real = store.engine.commit
    calls = {"n": 0}

    def failing(ops, more=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise StorageError("disk full", disk_full=True)
        return real(ops)

    monkeypatch.setattr(store.engine, "commit", failing)
    with pytest.raises(Unavailable) as exc:
        await append(store, "f", b"lost", producer=Producer("w", 0, 1), close=True)
    assert exc.value.disk_full
    s = store.get("f")
    assert (s.tail, s.pending.tail, s.meta.closed, s.pending.meta.closed) == (5, 5, False, False)
    assert s.producer("w").seq == 0
    # The same append, retried once space is back, goes through exactly once.
    await append(store, "f", b"2", producer=Producer("w", 0, 1))
    assert await read_all(store, "f") == b"keep12"


async def test_default_and_inherited_ttls_do_not_break_idempotent_creates(tmp_path):

    store = StreamStore(tmp_path / "data", settings=LimitsSettings(default_ttl=3600))
    await store.start()
    try:
        first = await store.create(CreateRequest("d", BIN))
        assert first.stream.meta.ttl == 3600
        assert not (await store.create(CreateRequest("d", BIN))).created
        with pytest.raises(Conflict):
            await store.create(CreateRequest("d", BIN, ttl=5))
        await store.create(CreateRequest("src", BIN, ttl=60))
        fork = await store.create(CreateRequest("f", None, fork=ForkRequest("src", None)))
        assert fork.stream.meta.ttl == 60  # inherited from the source
        assert not (
            await store.create(CreateRequest("f", None, fork=ForkRequest("src", None)))
        ).created
    finally:
        await store.stop()


async def test_a_duplicate_is_acknowledged_only_once_its_original_is_durable(store, monkeypatch):
    import asyncio
    import threading

    await store.create(CreateRequest("d", BIN))
    entered, gate = threading.Event(), threading.Event()
    real = store.engine.commit

    def slow_then_fail(ops, more=None):
        entered.set()
        gate.wait(10)
        raise StorageError("disk full", disk_full=True)

    duplicate = asyncio.Event()
    store.events.on_producer = lambda event: duplicate.set() if event == "duplicate" else None
    monkeypatch.setattr(store.engine, "commit", slow_then_fail)
    prod = Producer("w", 0, 0)
    original = asyncio.create_task(append(store, "d", b"x", producer=prod))
    assert await asyncio.to_thread(entered.wait, 10)  # its batch is being written
    retry = asyncio.create_task(append(store, "d", b"x", producer=prod))
    # Told a duplicate in the same step that then waits for the original's batch (no
    # I/O between): once this wakes, the retry is waiting, or it answered too early.
    await duplicate.wait()
    assert not retry.done()  # not acknowledged while the original is in flight
    gate.set()
    for task in (original, retry):
        with pytest.raises(Unavailable):
            await task
    monkeypatch.setattr(store.engine, "commit", real)
    r = await append(store, "d", b"x", producer=prod)
    assert r.appended and await read_all(store, "d") == b"x"
