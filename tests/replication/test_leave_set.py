"""A set member's directory opened by a single node leaves the set first
(``engine.replica.leave_set``, docs/replication.md, "A set's identity"): a single
node's writes move no replica position, so a member written to alone would still
look like one at its old position, and a standby there would be counted in sync
without those writes. Real engines and LMDB; a crash is simulated by stopping the
leave part way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_format.layout import Layout
from stream_format.meta import DB_INFO, StreamMeta
from stream_format.records import KIND_BYTES
from stream_server.engine import Engine, fsio
from stream_server.engine import replica as replica_mod
from stream_server.engine.data_dir import write_set_id
from stream_server.engine.ops import Append, CreateLog, PutStream
from stream_server.engine.replica import (
    KEY_LEFT,
    KEY_POSITION,
    KEY_TERMS,
    Left,
    ReplicaHooks,
    leave_set,
    stamp_base,
)
from stream_server.replication.identity import SetIdentity
from testkit.engines import crash
from testkit.fsio_recorder import Recorder

SET_X = "0123456789abcdef0123456789abcdef"
SET_Y = "fedcba9876543210fedcba9876543210"
META = StreamMeta(id=1, content_type="application/octet-stream", created_at=0.0)


class Crash(Exception):
    """The process dies here."""


def member_of_x(root: Path, *, set_id: str = SET_X, term: int = 2) -> tuple[int, int]:
    """A directory of set X's member: its set id file, a stream written under ``term``
    (so a replica position and a term history); returns the position."""
    e = Engine(root)
    e.open()
    hooks = ReplicaHooks()
    e.replica = hooks
    hooks.load(e)
    if set_id:
        write_set_id(e.layout, set_id)
    hooks.writable, hooks.term = True, term
    e.commit([CreateLog(1, 0), PutStream("a", META)])
    e.commit([Append(1, KIND_BYTES, [b"the set's "])])
    e.close()
    return hooks.durable


def single_node(root: Path) -> Engine:
    """An engine as a single-node server opens it: no replica hooks."""
    e = Engine(root)
    e.open()
    return e


def write_alone(e: Engine, data: bytes = b"written alone") -> None:
    e.commit([Append(1, KIND_BYTES, [data])])


def classify(root: Path, name: str = "ds-0") -> tuple[SetIdentity, ReplicaHooks]:
    """What a replica started on ``root`` takes the directory for (the server's order:
    recovery, ``ReplicaHooks.load``, ``SetIdentity.load``)."""
    e = Engine(root)
    hooks = ReplicaHooks()
    e.replica = hooks
    e.open()
    hooks.load(e)
    ident = SetIdentity(e.layout, name)
    ident.load(e, hooks)
    e.close()
    return ident, hooks


def info(root: Path) -> dict[bytes, bytes | None]:
    e = single_node(root)
    assert e.meta is not None
    with e.meta.env.begin() as txn:
        out = {k: txn.get(k, db=e.meta.dbs[DB_INFO]) for k in (KEY_POSITION, KEY_TERMS, KEY_LEFT)}
    e.close()
    return {k: None if v is None else bytes(v) for k, v in out.items()}


def never_a_stale_member(root: Path) -> None:
    """The rule: after a single node wrote here, a replica never takes the directory
    for set X's member (at its old position or any), and X's Lease is refused."""
    ident, hooks = classify(root)
    assert ident.kind == "single-node", (ident.kind, ident.set_id, hooks.durable)
    assert ident.set_id == "" and hooks.durable == (0, 0)
    assert "holds single-node data" in (ident.mismatch(SET_X) or "")
    assert ident.may_create() is None  # it may start a new set with its data


# ------------------------------------------------------------------ the leave


def test_a_member_opened_by_a_single_node_leaves_its_set(tmp_path: Path) -> None:
    position = member_of_x(tmp_path)
    assert position == (2, 2)
    ident, _ = classify(tmp_path)
    assert ident.kind == "member" and ident.set_id == SET_X  # as it was

    e = single_node(tmp_path)
    assert leave_set(e) == Left(SET_X, (2, 2))
    write_alone(e)
    e.close()

    assert not Layout(tmp_path).set_id_file.exists()
    kept = info(tmp_path)
    assert kept[KEY_POSITION] is None and kept[KEY_TERMS] is None
    assert json.loads(kept[KEY_LEFT] or b"") == {"set": SET_X, "position": [2, 2]}
    never_a_stale_member(tmp_path)

    e = single_node(tmp_path)  # the next single-node start: nothing left to leave
    assert leave_set(e) is None
    e.close()
    assert info(tmp_path) == kept


def test_the_lmdb_step_is_durable_before_the_set_id_file_goes(tmp_path: Path) -> None:
    member_of_x(tmp_path)
    e = single_node(tmp_path)
    recorder = Recorder()
    fsio.attach(recorder)
    try:
        leave_set(e)
    finally:
        fsio.attach(None)
    e.close()
    meta, set_id = str(Layout(tmp_path).meta), str(Layout(tmp_path).set_id_file)
    assert recorder.ops == [
        ("lmdb_commit", meta),
        ("lmdb_sync", meta),
        ("unlink", set_id),
        ("fsync_dir", str(tmp_path)),
    ]


def test_a_member_without_a_set_id_or_without_a_position_leaves_too(tmp_path: Path) -> None:
    # From before set ids: a replica position, no file.
    member_of_x(tmp_path / "old", set_id="")
    e = single_node(tmp_path / "old")
    assert leave_set(e) == Left("", (2, 2))
    write_alone(e)
    e.close()
    never_a_stale_member(tmp_path / "old")

    # An id minted for a Lease (a single server becoming a set) and no position yet.
    e = single_node(tmp_path / "minted")
    e.commit([CreateLog(1, 0), PutStream("a", META)])
    write_set_id(e.layout, SET_X)
    assert leave_set(e) == Left(SET_X, None)
    write_alone(e)
    e.close()
    never_a_stale_member(tmp_path / "minted")


def test_a_directory_of_no_set_is_left_as_it_is(tmp_path: Path) -> None:
    e = single_node(tmp_path / "empty")
    assert leave_set(e) is None
    e.close()
    assert info(tmp_path / "empty") == {KEY_POSITION: None, KEY_TERMS: None, KEY_LEFT: None}
    assert classify(tmp_path / "empty")[0].kind == "empty"

    e = single_node(tmp_path / "single")
    e.commit([CreateLog(1, 0), PutStream("a", META)])
    assert leave_set(e) is None
    e.close()
    assert info(tmp_path / "single") == {KEY_POSITION: None, KEY_TERMS: None, KEY_LEFT: None}
    assert classify(tmp_path / "single")[0].kind == "single-node"


# ---------------------------------------------------------------- crash points


def test_a_crash_before_the_lmdb_step_leaves_the_member_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    member_of_x(tmp_path)
    before = info(tmp_path)
    e = single_node(tmp_path)

    def dies(entries: object, **options: object) -> None:
        raise Crash

    monkeypatch.setattr(e, "write_metadata", dies)
    with pytest.raises(Crash):
        leave_set(e)
    crash(e)
    monkeypatch.undo()
    # Nothing was written alone: it is still X's member with exactly X's history.
    assert info(tmp_path) == before
    ident, hooks = classify(tmp_path)
    assert ident.kind == "member" and ident.set_id == SET_X and hooks.durable == (2, 2)
    # The next single-node start leaves before it writes.
    e = single_node(tmp_path)
    assert leave_set(e) == Left(SET_X, (2, 2))
    write_alone(e)
    e.close()
    never_a_stale_member(tmp_path)


@pytest.mark.parametrize("step", ["unlink", "fsync_dir"])
def test_a_crash_before_the_set_id_file_is_gone_is_single_node_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Stopped after the LMDB step, the file naming X is still there (not removed, or
    its removal not durable: the same after a power cut): the directory is single-node
    data all the same, for a replica started next and for a single node."""
    member_of_x(tmp_path)
    e = single_node(tmp_path)
    set_id_file = Layout(tmp_path).set_id_file
    kept = set_id_file.read_bytes()

    def dies(*args: object) -> None:
        raise Crash

    monkeypatch.setattr(replica_mod, "remove_set_id", dies)
    with pytest.raises(Crash):
        leave_set(e)
    crash(e)
    monkeypatch.undo()
    if step == "fsync_dir":
        set_id_file.write_bytes(kept)  # removed, but the removal was lost
    assert Layout(tmp_path).read_set_id() == SET_X

    # A replica started now (the set scaled up again) holds no set.
    never_a_stale_member(tmp_path)
    assert classify(tmp_path)[1].left == SET_X
    # A single node started now finishes the leave, then writes.
    e = single_node(tmp_path)
    assert leave_set(e) == Left(SET_X, (2, 2))
    assert not set_id_file.exists()
    write_alone(e)
    e.close()
    never_a_stale_member(tmp_path)


# ------------------------------------------------------------- a set founded after


def test_a_directory_that_left_a_set_founds_a_new_one(tmp_path: Path) -> None:
    member_of_x(tmp_path)
    e = single_node(tmp_path)
    leave_set(e)
    write_alone(e)
    e.close()

    # A replica starts on it without a Lease: single-node data, it may create one; the
    # id it mints is written first (``SetIdentity.settle``).
    ident, hooks = classify(tmp_path)
    assert ident.kind == "single-node" and ident.data
    write_set_id(Layout(tmp_path), SET_Y)
    # Crashed before it led: a member of Y (the file names another set than the one
    # left), with no position yet: it takes its Lease back, or follows Y.
    ident, hooks = classify(tmp_path)
    assert ident.kind == "member" and ident.set_id == SET_Y and hooks.durable == (0, 0)
    assert ident.mismatch(SET_Y) is None and ident.mismatch(SET_X) is not None

    # It leads: the base position, and the record of the set left goes with it.
    e = Engine(tmp_path)
    hooks = ReplicaHooks()
    e.replica = hooks
    e.open()
    hooks.load(e)
    base = stamp_base(e, hooks, 1)  # one past the lsn recovery saw (a clean stop: 0)
    assert base == (1, 1) and hooks.left is None
    e.close()
    kept = info(tmp_path)
    assert kept[KEY_LEFT] is None
    assert kept[KEY_TERMS] == json.dumps([[1, 1]]).encode()
    ident, hooks = classify(tmp_path)
    assert ident.kind == "member" and ident.set_id == SET_Y and hooks.durable == base
    assert hooks.left is None

    # Scaled down to one again: it leaves Y in turn.
    e = single_node(tmp_path)
    assert leave_set(e) == Left(SET_Y, base)
    e.close()
    ident, _ = classify(tmp_path)
    assert ident.kind == "single-node" and ident.set_id == ""
