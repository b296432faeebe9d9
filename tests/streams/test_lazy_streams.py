"""Streams loaded when first asked for (``pending.StreamTable``): a start builds no
Python object per stream, and a stream loaded later is the stream as committed, its
producers, TTL and forks included. A real engine in a temporary data directory."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from stream_format.meta import StreamMeta
from stream_server.declared.network import LimitsSettings
from stream_server.engine.recovery import has_expiry
from stream_server.streams.clock import ManualClock
from stream_server.streams.errors import Gone, NotFound, ProducerFenced
from stream_server.streams.replicated import ReplicatedStreams
from stream_server.streams.store import (
    AppendRequest,
    CreateRequest,
    ForkRequest,
    Producer,
    StreamStore,
)

BIN = "application/octet-stream"


async def reopened(data: Path, clock: ManualClock | None = None) -> StreamStore:
    store = StreamStore(data, settings=LimitsSettings(max_streams=12), clock=clock or ManualClock())
    await store.start()
    return store


async def test_a_start_loads_no_stream_and_a_request_loads_the_one_it_names(tmp_path):
    store = await reopened(tmp_path)
    for i in range(10):
        await store.create(CreateRequest(f"s/{i}", BIN, b"%d" % i))
    await store.stop()

    store = await reopened(tmp_path)
    assert store.table.by_path == {}
    assert len(store.streams) == 10 and store.recovery is not None
    assert store.recovery.streams == 10
    s = store.get("s/7")
    assert list(store.table.by_path) == ["s/7"] and s.tail == 1
    r = await store.read(s, 0, 100)
    assert b"".join(r.payloads) == b"7"
    with pytest.raises(NotFound):
        store.get("s/nope")
    assert sorted(store.streams) == [f"s/{i}" for i in range(10)]  # loads each
    await store.stop()


async def test_a_loaded_stream_keeps_its_producers_and_its_limit_counts_the_unloaded(tmp_path):
    store = await reopened(tmp_path)
    await store.create(CreateRequest("p", BIN))
    for seq in range(3):
        await store.append(AppendRequest("p", BIN, b"x", producer=Producer("w", 2, seq)))
    for i in range(11):
        await store.create(CreateRequest(f"f/{i}", BIN))
    await store.stop()

    store = await reopened(tmp_path)
    dup = await store.append(AppendRequest("p", BIN, b"x", producer=Producer("w", 2, 2)))
    assert dup.duplicate
    with pytest.raises(ProducerFenced):
        await store.append(AppendRequest("p", BIN, b"x", producer=Producer("w", 1, 0)))
    # Twelve streams, none of the eleven others loaded: the limit counts them all.
    with pytest.raises(Exception, match="stream limit"):
        await store.create(CreateRequest("one-more", BIN))
    await store.stop()


async def test_a_ttl_stream_is_swept_after_a_start_that_loaded_nothing(tmp_path):
    clock = ManualClock()
    store = await reopened(tmp_path, clock)
    await store.create(CreateRequest("ttl", BIN, ttl=10))
    await store.create(CreateRequest("keep", BIN))
    await store.stop()

    store = await reopened(tmp_path, clock)
    assert store.expiry.timed == {"ttl"} and store.table.by_path == {}
    clock.advance(11)
    assert store.sweep() == 1
    await store.expiry.drained()
    with pytest.raises(NotFound):
        store.get("ttl")
    assert store.get("keep").tail == 0
    await store.stop()


async def test_a_soft_deleted_source_loads_as_gone_and_its_fork_reads_through_it(tmp_path):
    store = await reopened(tmp_path)
    await store.create(CreateRequest("src", BIN, b"abcdef"))
    await store.create(CreateRequest("fork", BIN, fork=ForkRequest("src", 3)))
    await store.delete("src")  # soft: the fork reads through it
    await store.stop()

    store = await reopened(tmp_path)
    fork = store.get("fork")
    r = await store.read(fork, 0, 100)
    assert b"".join(r.payloads) == b"abc"
    with pytest.raises(Gone):
        store.get("src")
    await store.stop()


async def test_a_create_that_never_passed_the_gate_is_hidden_until_replication_publishes_it(
    tmp_path,
):
    """A batch durable here but refused at the ack gate (this replica was deposed):
    ``StreamTable.rollback`` undoes its create, LMDB holds the stream all the same, and
    no reader may load it until the replication layer publishes it."""
    store = await reopened(tmp_path)
    await store.create(CreateRequest("held", BIN))
    s = store.get("held")
    s.committed = False  # as the stream layer holds a create whose batch is gated
    store.table.rollback()
    with pytest.raises(NotFound):
        store.get("held")
    ReplicatedStreams(store).put("held", s.meta)
    assert store.get("held").tail == 0
    await store.stop()


async def test_past_the_hot_bound_idle_streams_go_and_come_back_as_committed(tmp_path):
    store = StreamStore(tmp_path, settings=LimitsSettings(hot_streams=16))
    await store.start()
    for i in range(40):
        await store.create(CreateRequest(f"s/{i}", BIN, b"%d;" % i))
    await store.stop()

    store = StreamStore(tmp_path, settings=LimitsSettings(hot_streams=16))
    await store.start()
    held = store.get("s/0")  # a request still using it: it must stay the one object
    for i in range(1, 40):
        store.get(f"s/{i}")
        assert len(store.table.by_path) <= 16 + 2
    assert store.table.get("s/0") is held and store.is_current(held)
    assert "s/1" not in store.table.by_path  # idle, least recently used: dropped
    await store.append(AppendRequest("s/1", BIN, b"more"))  # loaded again, then written
    again = store.get("s/1")
    r = await store.read(again, 0, 100)
    assert b"".join(r.payloads) == b"1;more" and again.tail == 6
    await store.stop()


def test_a_start_finds_ttl_streams_in_either_spelling_of_their_json():
    """Format 5 leaves out a null field; formats 1 to 4 spelled every one."""
    full = {"id": 1, "content_type": BIN, "created_at": 0.0, "ttl": None, "expires_at_ts": None}
    assert not has_expiry(orjson.dumps(full))
    assert has_expiry(orjson.dumps({**full, "ttl": 30}))
    assert has_expiry(orjson.dumps({**full, "expires_at_ts": 1.5}))
    assert not has_expiry(StreamMeta(id=1, content_type=BIN, created_at=0.0).to_json())
    assert has_expiry(StreamMeta(id=1, content_type=BIN, created_at=0.0, ttl=5).to_json())
