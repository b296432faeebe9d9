"""Crash states beyond kill -9: recover every state a power cut could leave, and check it.

A workload (appends in multi-stream batches, JSON, idempotent producers, a
fork, a close, deletes soft and cascading, expiry, WAL rotations and
checkpoints; small logs kept inline in LMDB and moved into their files as they
grow, data format 5) runs through the real stream store with the engine's I/O
recorded (``testkit.crashstates``). Each explored state is recovered by a
fresh store and must show:

- recovery never raises;
- every acknowledged operation: created streams exist, acknowledged data is
  there byte for byte, closes and producer sequence numbers hold, deleted
  streams are gone;
- nothing half-visible: each stream's recovered content ends exactly at the
  end of one of its appends (a batch either is there or is not);
- the Spark reader reads the recovered directory and sees the same bytes.

A second workload puts and deletes keyed values (data format 3) between
appends and in the same batches: after each crash state those values and the
streams' tails together must be the state after a prefix of the submitted
operations that holds every acknowledged one (``KeyedValueHistory``).

The three tests are one module because they share one
workload's expectations and their checker (``Expected``, ``required``,
``check_state``): a state is checked the same way whichever workload left it.

CRASH_STATES sets how many states are explored (default 1,500) and
CRASH_MIXED how many random mixes each crash point may get (default 3);
``make test-long`` explores many more. The test prints how many states were
explored and how many were distinct.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import pytest

from stream_format import wal
from stream_server.engine import Engine
from stream_server.engine.meta_writes import MetaWriter
from stream_server.engine.pipeline import CommitPipeline
from stream_server.streams.clock import ManualClock
from stream_server.streams.store import (
    AppendRequest,
    CreateRequest,
    ForkRequest,
    Producer,
    StoreLimits,
    StreamStore,
)
from testkit import summary
from testkit.crashstates import CrashState, KeyedValueHistory, Recording, check_each, recorded
from testkit.spark_rows import every_stream

pytestmark = pytest.mark.slow

BUDGET = int(os.environ.get("CRASH_STATES", "1500"))
MIXED = int(os.environ.get("CRASH_MIXED", "3"))  # random mixes per crash point
BIN = "application/octet-stream"
JSON = "application/json"


@dataclass
class Expected:
    """What the workload did, and what was acknowledged when (by place in the log)."""

    content: dict[str, list[bytes]] = field(default_factory=dict)  # units as written
    json: set[str] = field(default_factory=set)
    tails: dict[str, set[int]] = field(default_factory=dict)  # every batch boundary
    acks: list[tuple[int, str, str, object]] = field(default_factory=list)  # place, kind, path, v


def units(exp: Expected, path: str) -> list[bytes]:
    """A stream's content as units: bytes one by one, or JSON messages."""
    if path in exp.json:
        return exp.content[path]
    return [bytes([b]) for chunk in exp.content[path] for b in chunk]


async def run_workload(data_dir: Path, rec: Recording) -> Expected:
    exp = Expected()
    engine = Engine(data_dir, map_size=1 << 20, checkpoint_bytes=6 * 1024)
    clock = ManualClock()  # the Expires-At below passes when the test says, not after a wait
    store = StreamStore(
        data_dir, engine=engine, limits=StoreLimits(sweep_interval=3600), clock=clock
    )
    await store.start()

    def ack(kind: str, path: str, value: object = None) -> None:
        exp.acks.append((rec.ack((kind, path)), kind, path, value))

    async def create(path: str, ct: str, body: bytes = b"", **kw) -> None:
        r = await store.create(CreateRequest(path, ct, body, **kw))
        if ct == JSON:
            exp.json.add(path)
        exp.content.setdefault(path, [])
        exp.tails.setdefault(path, set()).add(r.tail)
        ack("create", path, r.tail)

    async def append(path: str, ct: str, body: bytes, piece: list[bytes], **kw) -> None:
        r = await store.append(AppendRequest(path, ct, body, **kw))
        exp.content[path] += piece
        exp.tails[path].add(r.tail)
        ack("append", path, r.tail)
        if kw.get("producer") is not None:
            p = kw["producer"]
            ack("producer", path, (p.id, p.epoch, p.seq))
        if kw.get("close"):
            ack("close", path)

    await create("a", BIN)
    await create("b", BIN)
    await create("c", BIN)
    for i in range(6):  # three streams per batch
        await asyncio.gather(
            *(
                append(name, BIN, data, [data])
                for name, data in (
                    ("a", bytes([65 + i]) * 700),
                    ("b", bytes([97 + i]) * 300),
                    ("c", bytes([48 + i]) * 1500),
                )
            )
        )
    await create("j", JSON, b'[{"n":0},{"n":1}]')
    exp.content["j"] = [b'{"n":0}', b'{"n":1}']
    await append("j", JSON, b'[{"n":2},"three",4]', [b'{"n":2}', b'"three"', b"4"])
    await create("p", BIN)
    for seq in range(4):
        data = b"p%d" % seq
        await append("p", BIN, data, [data], producer=Producer("w", 0, seq))
    dup = await store.append(AppendRequest("p", BIN, b"p3", producer=Producer("w", 0, 3)))
    assert dup.duplicate
    # A fork of "a" at unit 1400, then its own data.
    fork_at = 1400
    r = await store.create(CreateRequest("f", BIN, fork=ForkRequest("a", fork_at)))
    exp.content["f"] = [b"".join(exp.content["a"])[:fork_at]]
    exp.tails["f"] = {r.tail}
    ack("create", "f", r.tail)
    await append("f", BIN, b"F" * 2000, [b"F" * 2000])
    await append("c", BIN, b"last", [b"last"], close=True)
    await store.delete("b")
    ack("delete", "b")
    # Expiry: a stream whose Expires-At passes, removed by the sweeper.
    await create("t", BIN, b"ttl", expires_at="soon", expires_at_ts=clock.now + 1)
    exp.content["t"] = [b"ttl"]
    clock.advance(2)
    assert store.sweep() == 1
    await store.expiry.drained()  # the expiry's batch is durable
    ack("delete", "t")
    # Soft delete of a fork's source, then the fork: the cascade removes both.
    await store.delete("a")
    ack("soft-delete", "a")
    await append("f", BIN, b"G" * 500, [b"G" * 500])
    await store.delete("f")
    ack("delete", "f")
    ack("delete", "a")
    await store.stop()
    return exp


def required(exp: Expected, point: int) -> dict[str, dict]:
    """What must hold after a crash at ``point``, per stream path."""
    need: dict[str, dict] = {}
    for place, kind, path, value in exp.acks:
        if place >= point:
            break
        st = need.setdefault(path, {"tail": 0, "gone": False, "closed": False, "producers": {}})
        if kind in ("create", "append"):
            st["tail"] = max(st["tail"], value)
            st["exists"] = True
        elif kind == "close":
            st["closed"] = True
        elif kind == "producer":
            pid, epoch, seq = value
            st["producers"][pid] = (epoch, seq)
        elif kind == "delete":
            st["gone"] = True
        elif kind == "soft-delete":
            st["soft"] = True
    return need


async def check_state(
    data_dir: Path, exp: Expected, point: int, also: Callable[[StreamStore], None] | None = None
) -> dict[str, bytes | list]:
    """Recover ``data_dir`` and check it against the acknowledgements before ``point``
    (and with ``also``, on the same recovered store)."""
    store = StreamStore(data_dir, limits=StoreLimits(sweep_interval=3600))
    await store.start()
    seen: dict[str, bytes | list] = {}
    try:
        if also is not None:
            also(store)
        need = required(exp, point)
        for path in exp.content:
            want = need.get(path, {})
            s = store.streams.get(path)
            if want.get("gone"):
                assert s is None, f"{path}: deleted (acknowledged) but recovered"
                continue
            if s is None:
                # Missing is fine before the create is acknowledged, or once a delete
                # (acknowledged or still in flight at the crash) may have run.
                deleted_later = any(k == "delete" and p == path for _, k, p, _ in exp.acks)
                assert not want.get("exists") or deleted_later, (
                    f"{path}: created (acknowledged) but missing"
                )
                continue
            if want.get("soft"):
                assert s.meta.soft_deleted, f"{path}: soft delete acknowledged but not recovered"
            assert s.tail >= want.get("tail", 0), f"{path}: acknowledged tail {want} lost"
            assert s.tail in exp.tails[path], (
                f"{path}: recovered tail {s.tail} is not a batch boundary {sorted(exp.tails[path])}"
            )
            if want.get("closed"):
                assert s.meta.closed, f"{path}: close acknowledged but not recovered"
            for pid, (epoch, seq) in want.get("producers", {}).items():
                got = s.producers.get(pid)
                assert got is not None and (got.epoch, got.seq) >= (epoch, seq), (
                    f"{path}: producer {pid} acknowledged at {seq}, recovered {got}"
                )
            r = await store.read(s, 0, 1 << 30)
            got_units = (
                [bytes(p) for p in r.payloads]
                if s.is_json
                else [bytes([b]) for p in r.payloads for b in bytes(p)]
            )
            assert got_units == units(exp, path)[: s.tail], f"{path}: content differs"
            if not s.meta.soft_deleted and not s.expired(time.time()):  # Spark skips those
                seen[path] = got_units if s.is_json else b"".join(got_units)
    finally:
        await store.stop()
    return seen


def spark_read(data_dir: Path) -> dict[str, bytes | list]:
    """Each stream as the Spark reader sees it: JSON as rows, bytes joined."""
    rows, is_json = every_stream(data_dir)
    return {path: got if is_json[path] else b"".join(got) for path, got in rows.items()}


@pytest.mark.parametrize("deferring", ["as-it-comes", "whenever-it-may"])
def test_every_explored_crash_state_recovers_what_was_acknowledged(
    tmp_path, monkeypatch, deferring
):
    """``whenever-it-may``: every batch of tails only is taken to have one behind it, so
    LMDB falls behind the WAL by up to MAX_DEFERRED frames (engine/meta_writes.py)
    wherever the workload allows, not only where its timing happens to."""
    deferred = []
    if deferring == "whenever-it-may":
        monkeypatch.setattr(CommitPipeline, "_more", lambda self: True)
        real_defer = MetaWriter.defer

        def counted(self: MetaWriter, changes: list) -> None:
            deferred.append(len(changes))
            real_defer(self, changes)

        monkeypatch.setattr(MetaWriter, "defer", counted)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    rec = Recording(data_dir)
    exp = recorded(rec, lambda rec: run_workload(data_dir, rec))
    if deferring == "whenever-it-may":
        assert len(deferred) >= 5, deferred  # the workload has that many batches of tails only
    kinds = {op[0] for op in rec.ops}
    # The workload reached what it is meant to cover.
    assert {"mkdir", "create", "write", "fsync", "fsync_dir", "rename", "unlink"} <= kinds, kinds
    assert sum(op[0] == "lmdb_sync" for op in rec.ops) >= 3  # checkpoints ran
    assert sum(1 for op in rec.ops if op[0] == "create" and op[1].startswith("wal/")) >= 3

    def check(state: CrashState, directory: Path) -> None:
        seen = asyncio.run(check_state(directory, exp, state.point))
        spark = spark_read(directory)
        for path, content in seen.items():
            assert spark.get(path, content[:0]) == content, (
                f"{path}: the Spark reader disagrees with the server"
            )

    explored, distinct = check_each(rec, BUDGET, tmp_path / "states", check, mixed=MIXED)
    summary.report(
        "figures",
        f"crash states ({deferring}): {len(rec.ops)} ops recorded, {explored} states explored, "
        f"{distinct} distinct, all recovered what was acknowledged",
    )
    assert explored == min(BUDGET, explored) and distinct > 0


@pytest.mark.parametrize("era", ["current", "format-1", "format-2"])
def test_crash_states_during_recovery_keep_what_the_wal_held(tmp_path, era):
    """Recovery itself is crash-safe: it redoes WAL frames into segment files, then
    deletes the WAL; a crash anywhere in between must not lose what the WAL held,
    even when the segment file it recreated was never in a synced directory.

    ``format-1``: the crash left a format-1 directory (headerless WAL files, a
    one-line FORMAT), which recovery replays and then raises to the current
    format; a crash anywhere in that upgrade must leave a directory that opens.
    ``format-2``: the same from format 2 (no records database), and the first
    record put after the upgrade is there once acknowledged."""

    async def before_the_crash(data_dir: Path, crashed: Path) -> bytes:
        engine = Engine(data_dir, map_size=1 << 20, checkpoint_bytes=1 << 30)
        store = StreamStore(data_dir, engine=engine, limits=StoreLimits(sweep_interval=3600))
        await store.start()
        await store.create(CreateRequest("s", BIN))
        for i in range(5):
            await store.append(AppendRequest("s", BIN, bytes([65 + i]) * 900))
        # kill -9 here: the page cache is there, then the segment file's name is lost
        # (its directory was never synced; the WAL holds its bytes).
        shutil.copytree(data_dir, crashed)
        segment = store.engine.layout.segment_path(store.get("s").id)
        (crashed / segment.relative_to(data_dir)).unlink()
        await store.stop()
        return b"".join(bytes([65 + i]) * 900 for i in range(5))

    async def recover_and_go_on(crashed: Path, rec: Recording) -> None:
        store = StreamStore(crashed, limits=StoreLimits(sweep_interval=3600))
        await store.start()
        rec.ack(("recovered", "s"))
        await store.put_keyed_value("subs", "a", b"1")
        rec.ack(("record", "a"))
        await store.append(AppendRequest("s", BIN, b"after"))
        rec.ack(("append", "s"))
        await store.stop()

    crashed = tmp_path / "crashed"
    acked = asyncio.run(before_the_crash(tmp_path / "data", crashed))
    if era == "format-1":
        (crashed / "FORMAT").write_text("durable-streams-py data format 1\n")
        for path in wal.wal_files(crashed / "wal"):
            path.write_bytes(path.read_bytes()[wal.HEADER_SIZE :])
    if era in ("format-1", "format-2"):
        if era == "format-2":
            (crashed / "FORMAT").write_text("durable-streams-py data format 2\nread-version 1\n")
        env = lmdb.open(str(crashed / "meta"), max_dbs=8)
        with env.begin(write=True) as txn:  # as older servers left it
            txn.drop(env.open_db(b"records", txn=txn), delete=True)
        env.close()
    rec = Recording(crashed)
    rec.start_from_disk()
    recorded(rec, lambda rec: recover_and_go_on(crashed, rec))
    assert any(op[0] == "unlink" and op[1].startswith("wal/") for op in rec.ops)
    if era != "current":
        assert ("rename", "FORMAT.tmp", "FORMAT") in rec.ops  # the upgrade was recorded

    async def read(directory: Path) -> tuple[bytes, dict[str, bytes]]:
        store = StreamStore(directory, limits=StoreLimits(sweep_interval=3600))
        await store.start()
        try:
            s = store.get("s")
            data = b"".join(bytes(p) for p in (await store.read(s, 0, 1 << 30)).payloads)
            return data, store.keyed_values("subs")
        finally:
            await store.stop()

    def check(state: CrashState, directory: Path) -> None:
        got, records = asyncio.run(read(directory))
        assert got in (acked, acked + b"after"), (
            f"recovered {len(got)} bytes, acknowledged {len(acked)}"
        )
        # The record was acknowledged before the append was submitted.
        put_acked = any(op == ("ack", ("record", "a")) for op in rec.ops[: state.point])
        want = [{"a": b"1"}] if put_acked or got != acked else [{}, {"a": b"1"}]
        assert records in want, f"records {records}, expected one of {want}"

    explored, distinct = check_each(rec, BUDGET, tmp_path / "states", check, mixed=MIXED)
    summary.report(
        "figures", f"recovery crash states ({era}): {explored} explored, {distinct} distinct"
    )


# -------------------------------------------------------------- keyed values

SPACES = ("subs", "cursors")


async def run_keyed_values_workload(
    data_dir: Path, rec: Recording
) -> tuple[Expected, KeyedValueHistory]:
    """Record puts and deletes between appends and in the same batches as appends,
    across WAL rotations and checkpoints, as the subscription manager makes them."""
    exp = Expected()
    history = KeyedValueHistory()
    engine = Engine(data_dir, map_size=1 << 20, checkpoint_bytes=6 * 1024)
    store = StreamStore(data_dir, engine=engine, limits=StoreLimits(sweep_interval=3600))
    await store.start()

    tails: dict[str, int] = {}

    async def append(path: str, data: bytes) -> None:
        # The stream's tail is part of the keyed history too, so that a batch's
        # records and its appends are seen to come back together or not at all.
        tails[path] += len(data)
        i = history.submit(("stream", path), b"%d" % tails[path])
        r = await store.append(AppendRequest(path, BIN, data))
        history.ack(rec, i)
        exp.content[path].append(data)
        exp.tails[path].add(r.tail)
        exp.acks.append((rec.ack(("append", path)), "append", path, r.tail))

    async def put(space: str, key: str, value: bytes | None) -> None:
        i = history.submit((space, key), value)  # in the same step as the store's submit
        await store.put_keyed_value(space, key, value)
        history.ack(rec, i)

    for path in ("log", "other"):
        tails[path] = 0
        i = history.submit(("stream", path), b"0")
        r = await store.create(CreateRequest(path, BIN))
        history.ack(rec, i)
        exp.content[path], exp.tails[path] = [], {r.tail}
        exp.acks.append((rec.ack(("create", path)), "create", path, r.tail))
    for i in range(8):
        # Submitted together: the first goes out at once, the rest share the next
        # batch, an append ahead of records (puts of both spaces, a delete).
        await asyncio.gather(
            append("log", bytes([65 + i]) * 900),
            append("other", b"-" * (i + 1)),
            put("subs", f"s{i % 3}", b'{"generation":%d,"pad":"%s"}' % (i, b"x" * (i * 700))),
            put("cursors", f"s{i % 3}/stream-{i}", b"%016d" % (i * 900)),
            *([put("subs", f"s{(i + 1) % 3}", None)] if i % 2 else []),
        )
        # A lone record between appends.
        await put("cursors", "lone", b"%d" % i)
        await append("log", bytes([97 + i]) * 300)
        if i == 5:
            await put("cursors", "lone", None)
    await store.stop()
    return exp, history


def test_every_explored_crash_state_keeps_the_acknowledged_keyed_values(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    rec = Recording(data_dir)
    exp, history = recorded(rec, lambda rec: run_keyed_values_workload(data_dir, rec))
    assert sum(op[0] == "lmdb_sync" for op in rec.ops) >= 3  # checkpoints ran
    assert sum(1 for op in rec.ops if op[0] == "create" and op[1].startswith("wal/")) >= 3

    def keyed_state(store: StreamStore) -> dict[object, bytes]:
        """The keyed values and the streams' tails, as the keyed history names them."""
        got: dict[object, bytes] = {
            (space, k): v for space in SPACES for k, v in store.keyed_values(space).items()
        }
        for path in ("log", "other"):
            if path in store.streams:
                got["stream", path] = b"%d" % store.streams[path].tail
        return got

    applied: set[int] = set()

    def check(state: CrashState, directory: Path) -> None:
        asyncio.run(
            check_state(
                directory,
                exp,
                state.point,
                also=lambda store: applied.add(history.check(state.point, keyed_state(store))),
            )
        )

    explored, distinct = check_each(rec, BUDGET, tmp_path / "states", check, mixed=MIXED)
    summary.report(
        "figures",
        f"keyed-value crash states: {len(rec.ops)} ops recorded, {len(history.ops)} keyed "
        f"value and stream operations, {explored} states explored, {distinct} distinct, "
        f"{len(applied)} different prefixes recovered",
    )
    # The states reached both ends: nothing applied yet, and every operation.
    assert 0 in applied and len(history.ops) in applied
