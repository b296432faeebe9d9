"""Retention over a real engine in a temporary data directory: policies, drops at record
boundaries, punched blocks, reads before the start, forks, and restarts."""

from __future__ import annotations

import os

import orjson
import pytest

from stream_server.config import Settings
from stream_server.streams.errors import OffsetGone
from stream_server.streams.requests import ForkRequest
from stream_server.streams.retention import Policy, match, parse_policies, parse_policy
from stream_server.streams.store import AppendRequest, CreateRequest, StreamStore
from stream_server.streams.store_options import StoreLimits

BIN = "application/octet-stream"
JSON = "application/json"
KIB = 1024


def allocated(store: StreamStore, path: str) -> int:
    """Bytes the file system holds for the stream's segment file (punched holes excluded)."""
    return os.stat(store.engine.segments.path(store.get(path).id)).st_blocks * 512


async def open_store(tmp_path, *policies: str) -> StreamStore:
    store = StreamStore(
        tmp_path / "data",
        limits=StoreLimits(retention=parse_policies(policies), sweep_interval=3600),
    )
    await store.start()
    store.retention.stop()  # sweeps run when the test says (``sweep()``), not on their own
    return store


async def append(store: StreamStore, path: str, body: bytes, ct: str = BIN) -> int:
    return (await store.append(AppendRequest(path, ct, body))).tail


def test_policies_parse_with_units_and_refuse_bad_rules() -> None:
    p = parse_policy("logs/:max-bytes=10GiB,max-age=7d")
    assert p == Policy("logs/", 10 << 30, 7 * 86400.0)
    assert parse_policy(":max-bytes=512KiB").max_bytes == 512 * KIB
    assert parse_policy("a:max-age=30s,max-bytes=10MiB") == Policy("a", 10 << 20, 30.0)
    assert parse_policy("a:max-age=15m").max_age == 900
    assert parse_policy("a:max-age=12h").max_age == 43200
    for bad, why in [
        ("logs/", "PREFIX:RULES"),
        ("logs/:", "NAME=VALUE"),
        ("logs/:max-bytes=10XB", "not a size"),
        ("logs/:max-bytes=0", "positive"),
        ("logs/:max-age=7w", "not a duration"),
        ("logs/:max-age=7d,max-age=1d", "twice"),
        ("logs/:keep=1", "unknown rule"),
        ("/logs/:max-age=1d", "relative to the stream base path"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_policy(bad)
    with pytest.raises(ValueError, match="more than once"):
        parse_policies(["a:max-age=1d", "a:max-bytes=1MiB"])
    with pytest.raises(ValueError, match="not a size"):
        Settings(retention=["x:max-bytes=lots"])


def test_the_longest_matching_prefix_wins() -> None:
    ps = parse_policies([":max-age=7d", "logs/:max-age=1d", "logs/audit/:max-bytes=1MiB"])
    assert match(ps, "other") == ps[0]
    assert match(ps, "logs/x") == ps[1]
    assert match(ps, "logs/audit/x") == ps[2]
    assert match(parse_policies(["logs/:max-age=1d"]), "other") is None


async def test_max_bytes_drops_whole_records_punches_the_file_and_refuses_old_offsets(
    tmp_path,
) -> None:
    store = await open_store(tmp_path, "logs/:max-bytes=64KiB")
    try:
        await store.create(CreateRequest("logs/a", BIN))
        await store.create(CreateRequest("keep/a", BIN))
        chunk = 10 * KIB
        for i in range(40):
            body = bytes([i]) * chunk
            await append(store, "logs/a", body)
            await append(store, "keep/a", body)
        assert allocated(store, "logs/a") > 300 * KIB
        moved = await store.retention.sweep()
        assert moved == 1  # keep/a is under no policy
        s = store.get("logs/a")
        first = store.earliest(s)
        assert first % chunk == 0  # a record boundary: whole appends only
        tail = store.engine.tails[s.id]
        assert tail.file_len - tail.start_pos <= 64 * KIB
        # The blocks below the start went back to the file system.
        assert allocated(store, "logs/a") <= 64 * KIB + 3 * 4096
        assert allocated(store, "keep/a") > 300 * KIB
        assert store.earliest(store.get("keep/a")) == 0
        # Everything from the start on reads back intact; before it is 410.
        r = await store.read(s, first, 1 << 30)
        data = b"".join(r.payloads)
        assert r.next == s.tail == 40 * chunk
        assert data == b"".join(bytes([i]) * chunk for i in range(first // chunk, 40))
        with pytest.raises(OffsetGone) as gone:
            await store.read(s, first - 1, 1 << 20)
        assert gone.value.earliest == first
        # A second sweep with nothing new to drop changes nothing.
        assert await store.retention.sweep() == 0
    finally:
        await store.stop()


async def test_json_streams_drop_whole_messages(tmp_path) -> None:
    store = await open_store(tmp_path, "j/:max-bytes=2KiB")
    try:
        await store.create(CreateRequest("j/s", JSON))
        for i in range(100):
            await append(store, "j/s", b'[{"n":%d,"pad":"%s"}]' % (i, b"x" * 40), JSON)
        await store.retention.sweep()
        s = store.get("j/s")
        first = store.earliest(s)
        assert 0 < first < 100
        r = await store.read(s, first, 1 << 20)
        assert [orjson.loads(p)["n"] for p in r.payloads] == list(range(first, 100))
    finally:
        await store.stop()


async def test_max_age_uses_record_times_and_a_controllable_clock(tmp_path) -> None:
    store = await open_store(tmp_path, "t/:max-age=1h")
    try:
        await store.create(CreateRequest("t/s", BIN))
        await append(store, "t/s", b"old" * 100)
        await append(store, "t/s", b"old" * 100)
        s = store.get("t/s")
        real = store.retention.clock
        assert await store.retention.sweep() == 0  # nothing is an hour old yet
        size, age = store.retention.stats()["t/"]
        assert size == 2 * (28 + 300) and 0 <= age < 3600
        base = real()
        store.retention.clock = lambda: base + 3600 + 5  # an hour later
        await append(store, "t/s", b"new")  # committed "now": real time, below the cutoff
        # The records written before (and the one just written, by the real clock) are
        # older than an hour by the controlled clock: all dropped, the start is the tail.
        assert await store.retention.sweep() == 1
        assert store.earliest(s) == s.tail == 603
        store.retention.clock = lambda: base  # back to now: nothing more to drop
        await append(store, "t/s", b"newer")
        assert await store.retention.sweep() == 0
        r = await store.read(s, store.earliest(s), 1 << 20)
        assert b"".join(r.payloads) == b"newer"
        assert store.retention.stats()["t/"][0] == 28 + 5
    finally:
        await store.stop()


async def test_a_source_with_forks_is_pinned_and_forks_inherit_its_start(tmp_path) -> None:
    store = await open_store(tmp_path, "src/:max-bytes=8KiB")
    try:
        await store.create(CreateRequest("src/a", BIN))
        for i in range(10):
            await append(store, "src/a", bytes([i]) * 4 * KIB)
        await store.retention.sweep()
        src = store.get("src/a")
        first = store.earliest(src)
        assert first >= 32 * KIB
        # A fork at an offset the source no longer holds: 410, nothing created.
        with pytest.raises(OffsetGone):
            await store.create(CreateRequest("f/old", BIN, fork=ForkRequest("src/a", 0)))
        assert "f/old" not in store.streams
        await store.create(CreateRequest("f/new", BIN, fork=ForkRequest("src/a", 40 * KIB)))
        fork = store.get("f/new")
        assert store.earliest(fork) == first  # inherited
        # While the fork exists the source keeps everything the fork reads.
        for _ in range(10):
            await append(store, "src/a", b"z" * 4 * KIB)
        assert await store.retention.sweep() == 0
        assert store.earliest(store.get("src/a")) == first
        r = await store.read(fork, first, 1 << 20)
        held = range(first // (4 * KIB), 10)
        assert b"".join(r.payloads) == b"".join(bytes([i]) * 4 * KIB for i in held)
        # Without the fork, the source is trimmed again.
        await store.delete("f/new")
        assert await store.retention.sweep() == 1
        assert store.earliest(store.get("src/a")) > first
    finally:
        await store.stop()


async def test_the_start_survives_a_restart_and_recovery_punches_again(tmp_path) -> None:
    store = await open_store(tmp_path, "r/:max-bytes=16KiB")
    await store.create(CreateRequest("r/s", BIN))
    for i in range(30):
        await append(store, "r/s", bytes([i]) * 4 * KIB)
    await store.retention.sweep()
    s = store.get("r/s")
    first, sid = store.earliest(s), s.id
    path = store.engine.segments.path(sid)
    await store.stop()
    # Undo the punch behind the engine's back (as a WAL replay of old frames does):
    # recovery must give the blocks back again.
    with path.open("r+b") as f:
        f.seek(8192)
        f.write(b"\xff" * (first - 8192))
    assert os.stat(path).st_blocks * 512 > 100 * KIB
    again = await open_store(tmp_path, "r/:max-bytes=16KiB")
    try:
        s = again.get("r/s")
        assert again.earliest(s) == first
        assert os.stat(path).st_blocks * 512 <= 16 * KIB + 3 * 4096
        r = await again.read(s, first, 1 << 20)
        assert r.next == s.tail == 30 * 4 * KIB
        with pytest.raises(OffsetGone):
            await again.read(s, 0, 1 << 20)
    finally:
        await again.stop()


def test_a_drop_in_a_batch_moves_the_start_forward_only_and_never_for_a_dropped_stream() -> None:
    from stream_format import wal
    from stream_format.meta import DB_INDEX, DB_TAILS, TailValue, decode_tail, encode_tail, id_key
    from stream_server.engine.batch import Tail, build
    from stream_server.engine.ops import DropHead, DropLog

    tails = {1: Tail(10_016, 10_000, 0), 2: Tail(116, 100, 0)}
    key = b"\x00" * 16
    batch = build([DropHead(1, 4_000, 4_100, [key])], tails, now_us=1)
    puts = [e for e in batch.changes if e[0] == wal.PUT and e[1] == DB_TAILS]
    assert [decode_tail(e[3]) for e in puts] == [TailValue(10_016, 10_000, 0, 4_000, 4_100)]
    assert (wal.DELETE, DB_INDEX, key) in batch.changes and batch.heads == {1: 4_100}
    moved = {1: Tail(10_016, 10_000, 0, 4_000, 4_100)}
    for stale in (DropHead(1, 4_000, 4_100), DropHead(1, 3_000, 3_100), DropHead(1, 10_001, 1)):
        assert build([stale], moved, now_us=1).changes == []  # back, again, past the tail
    assert build([DropLog(2), DropHead(2, 50, 66)], tails, now_us=1).heads == {}
    dropped = build([DropLog(2), DropHead(2, 50, 66)], tails, now_us=1)
    assert not [e for e in dropped.changes if e[0] == wal.PUT and e[2] == id_key(2)]
    # Nothing dropped: the 24-byte value formats 1-3 wrote; other lengths are refused.
    assert len(encode_tail(TailValue(116, 100, 0, 0, 16))) == 24
    assert len(encode_tail(TailValue(116, 100, 0, 50, 66))) == 40
    with pytest.raises(ValueError, match="32 bytes"):
        decode_tail(b"\x00" * 32)
