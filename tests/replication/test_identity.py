"""A replica set's identity (``replication/identity.py``): the set id file, what a data
directory holds, who may create the Lease (the role loop against the emulated API
server), who may lead, and what the primary refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_format.layout import FormatError, Layout
from stream_format.meta import StreamMeta
from stream_server.engine import Engine, fsio
from stream_server.engine.data_dir import prepare, remove_set_id, write_set_id
from stream_server.engine.ops import CreateLog, PutStream
from stream_server.engine.replica import ReplicaHooks, stamp_base
from stream_server.replication.identity import WAITING, SetIdentity, refusal
from stream_server.replication.lease.kube_lease import LeaseClient, LeaseRecord
from stream_server.replication.lease.roles import RoleLoop
from testkit.cluster import Cluster
from testkit.fsio_recorder import Recorder
from tests.replication import role_loops
from tests.replication.role_loops import DURATION, Clock

SET_X = "0123456789abcdef0123456789abcdef"
SET_Y = "fedcba9876543210fedcba9876543210"


# ------------------------------------------------------------ the set id file


def test_the_set_id_file_is_written_as_the_version_file_is(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    recorder = Recorder()
    fsio.attach(recorder)
    try:
        write_set_id(layout, SET_X)
    finally:
        fsio.attach(None)
    tmp, final = str(tmp_path / "SET_ID.tmp"), str(tmp_path / "SET_ID")
    assert [op[0] for op in recorder.ops] == ["create", "write", "fsync", "rename", "fsync_dir"]
    assert recorder.ops[1][1] == tmp and recorder.ops[1][3] == (SET_X + "\n").encode()
    assert recorder.ops[2] == ("fsync", tmp)  # flushed before it is renamed into place
    assert recorder.ops[3] == ("rename", tmp, final)
    assert recorder.ops[4] == ("fsync_dir", str(tmp_path))  # the rename is durable
    assert layout.read_set_id() == SET_X
    write_set_id(layout, SET_Y)  # replaced whole
    assert layout.read_set_id() == SET_Y


def test_a_missing_set_id_reads_empty_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert layout.read_set_id() == ""
    for bad in ("", "not an id\n", SET_X, SET_X.upper() + "\n", SET_X + "\nmore\n"):
        layout.set_id_file.write_text(bad)
        with pytest.raises(FormatError, match="not a replica set id"):
            layout.read_set_id()
    with pytest.raises(ValueError):
        write_set_id(layout, "x" * 32)
    prepare(Layout(tmp_path / "data"))
    (tmp_path / "data" / "SET_ID").write_text("not an id\n")
    with pytest.raises(FormatError):  # the server's start refuses it, as a bad FORMAT
        prepare(Layout(tmp_path / "data"))
    remove_set_id(layout)
    assert layout.read_set_id() == ""


def test_a_torn_set_id_write_leaves_the_old_file_and_its_leftover_is_removed(
    tmp_path: Path,
) -> None:
    layout = Layout(tmp_path / "data")
    prepare(layout)
    write_set_id(layout, SET_X)
    (layout.root / "SET_ID.tmp").write_text(SET_Y[:10])  # a crash before the rename
    assert layout.read_set_id() == SET_X
    prepare(layout)  # the next start
    assert not (layout.root / "SET_ID.tmp").exists()
    assert layout.read_set_id() == SET_X


# ------------------------------------------------------- what a directory holds


def opened(root: Path) -> tuple[Engine, ReplicaHooks]:
    e = Engine(root)
    e.open()
    hooks = ReplicaHooks()
    e.replica = hooks
    hooks.load(e)
    return e, hooks


def single_node_data(root: Path) -> None:
    """A directory a single server wrote (no replica hooks: no position)."""
    e = Engine(root)
    e.open()
    meta = StreamMeta(id=1, content_type="application/octet-stream", created_at=0.0)
    e.commit([CreateLog(1, 0), PutStream("a", meta)])
    e.close()


def test_a_directory_is_empty_single_node_data_or_a_member(tmp_path: Path) -> None:
    e, hooks = opened(tmp_path / "empty")
    ident = SetIdentity(e.layout, "ds-1")
    ident.load(e, hooks)
    assert ident.kind == "empty"
    e.close()

    single_node_data(tmp_path / "single")
    e, hooks = opened(tmp_path / "single")
    ident = SetIdentity(e.layout, "ds-0")
    ident.load(e, hooks)
    assert ident.kind == "single-node" and hooks.durable == (0, 0)
    assert "single-node data" in (ident.mismatch(SET_Y) or "")
    # It leads a new set: it gets an id, and a position past everything it holds.
    write_set_id(e.layout, SET_X)
    assert stamp_base(e, hooks, 1) == (1, 1)
    e.close()
    e, hooks = opened(tmp_path / "single")
    ident = SetIdentity(e.layout, "ds-0")
    ident.load(e, hooks)
    assert ident.kind == "member" and ident.set_id == SET_X
    assert hooks.durable == (1, 1) and hooks.terms == [(1, 1)]
    assert ident.mismatch(SET_X) is None
    assert f"set {SET_X}'s data" in (ident.mismatch(SET_Y) or "")
    e.close()


def test_a_member_from_before_set_ids_adopts_the_lease_s(tmp_path: Path) -> None:
    ident = SetIdentity(Layout(tmp_path), "ds-1")
    ident.data = ident.positioned = True  # a replica position, no id file
    assert ident.kind == "member" and ident.mismatch(SET_Y) is None


# -------------------------------------------------------- the primary's refusal


def test_the_primary_refuses_another_set_and_an_unknown_empty_follower() -> None:
    assert refusal(SET_X, SET_X, (0, 0), (1, 9), 1) is None
    assert refusal(SET_X, SET_Y, (1, 5), (1, 9), 3) == {
        "error": "other set",
        "set": SET_X,
        "term": 3,
    }
    assert refusal(SET_X, SET_Y, None, (1, 9), 3) is not None  # a snapshot, too
    # No set id (a version before them) at (0, 0): empty or single-node data, neither
    # can follow the frames of a primary with a history.
    assert refusal(SET_X, "", (0, 0), (1, 9), 1) == {"error": "too far behind: re-copy", "term": 1}
    assert refusal(SET_X, "", (0, 0), (0, 0), 1) is None  # a new set: nothing to copy
    assert refusal(SET_X, "", (1, 4), (1, 9), 1) is None


# ------------------------------------------------------------ the role loop


def identity(
    root: Path, name: str, *, bootstrap: str = "", data: bool = False, positioned: bool = False
) -> SetIdentity:
    root.mkdir(parents=True, exist_ok=True)
    ident = SetIdentity(Layout(root), name, bootstrap)
    ident.set_id = ident.layout.read_set_id()
    ident.data, ident.positioned = data, positioned
    return ident


def replica(
    api: Cluster,
    lease: str,
    name: str,
    ident: SetIdentity,
    clock: Clock,
    position: tuple[int, int] = (0, 0),
) -> RoleLoop:
    return role_loops.replica(api, lease, name, clock, position, identity=ident)


def annotations(api: Cluster, lease: str) -> dict[str, str]:
    ns, name = lease.split("/")
    return api.get("Lease", ns, name)["metadata"]["annotations"]  # type: ignore[index]


async def test_only_the_bootstrap_replica_starts_a_set_from_empty_storage(
    api, lease, tmp_path
) -> None:
    clock = Clock()
    one = identity(tmp_path / "ds-1", "ds-1", bootstrap="ds-0")
    b = replica(api, lease, "ds-1", one, clock)
    await b.step()
    await b.step()
    assert b.record is None and b.state.role == "standby"  # no Lease: it waits
    assert one.problem == WAITING and one.set_id == ""
    zero = identity(tmp_path / "ds-0", "ds-0", bootstrap="ds-0")
    a = replica(api, lease, "ds-0", zero, clock)
    await a.step()
    assert (a.state.role, a.state.term) == ("primary", 1)
    assert len(zero.set_id) == 32 and zero.layout.read_set_id() == zero.set_id  # file first
    assert annotations(api, lease)["streams.pyds.dev/set-id"] == zero.set_id
    await b.step()
    assert (b.state.role, b.state.primary_url) == ("standby", "http://ds-0:4437")
    assert await one.join(b.record.set_id) is None  # type: ignore[union-attr]
    assert one.layout.read_set_id() == zero.set_id and one.problem is None  # adopted


async def test_without_a_bootstrap_replica_any_empty_replica_may_start_the_set(
    api, lease, tmp_path
) -> None:
    a = replica(api, lease, "r1", identity(tmp_path / "r1", "r1"), Clock())
    await a.step()
    assert a.state.role == "primary"


async def test_a_replica_with_data_creates_the_lease_whoever_the_bootstrap_is(
    api, lease, tmp_path
) -> None:
    single = identity(tmp_path / "ds-2", "ds-2", bootstrap="ds-0", data=True)
    assert single.kind == "single-node"
    a = replica(api, lease, "ds-2", single, Clock())
    await a.step()
    assert a.state.role == "primary"
    assert single.kind == "member" and single.layout.read_set_id() == single.set_id
    assert annotations(api, lease)["streams.pyds.dev/set-id"] == single.set_id
    member = identity(tmp_path / "m", "ds-1", bootstrap="ds-0", data=True)
    write_set_id(member.layout, SET_X)
    member.set_id = SET_X
    other = "default/" + lease.split("/")[1][:40] + "-m"
    m = replica(api, other, "ds-1", member, Clock(), position=(3, 40))
    await m.step()  # its set's Lease was deleted: recreated with its id
    assert m.state.role == "primary"
    assert annotations(api, other)["streams.pyds.dev/set-id"] == SET_X


async def test_a_creator_that_lost_the_race_forgets_the_id_it_minted(api, lease, tmp_path) -> None:
    single = identity(tmp_path / "a", "a", data=True)
    a = replica(api, lease, "a", single, Clock())
    winner = LeaseClient(lease, api.url)
    try:
        await winner.create(LeaseRecord(holder="b", term=1, set_id=SET_Y, duration=15))
    finally:
        await winner.close()
    real_get = a.client.get

    async def before_b_created_it() -> LeaseRecord | None:
        a.client.get = real_get  # type: ignore[method-assign]
        return None

    a.client.get = before_b_created_it  # type: ignore[method-assign]
    await a.step()  # it read no Lease just before b created it: its create gets 409
    assert a.state.role == "standby"
    assert single.set_id == "" and not single.layout.set_id_file.exists()
    assert single.kind == "single-node"  # what it was: it still may not join set Y
    await a.step()
    assert "single-node data" in (single.mismatch(a.record.set_id) or "")  # type: ignore[union-attr]


async def test_another_set_s_replica_never_takes_the_lease(api, lease, tmp_path) -> None:
    client = LeaseClient(lease, api.url)
    try:
        await client.create(
            LeaseRecord(holder="r2", term=4, in_sync=["r1"], set_id=SET_Y, duration=15)
        )
    finally:
        await client.close()
    clock = Clock()
    stranger = identity(tmp_path / "r2", "r2", data=True, positioned=True)
    write_set_id(stranger.layout, SET_X)
    stranger.set_id = SET_X
    r2 = replica(api, lease, "r2", stranger, clock, position=(9, 900))
    await r2.step()  # named holder: a replica of set Y would take its Lease back at once
    clock.now += 3 * DURATION
    await r2.step()  # expired, and it is the old holder: still not its set
    assert r2.state.role == "standby" and r2.record.term == 4  # type: ignore[union-attr]
    assert stranger.layout.read_set_id() == SET_X
    single = identity(tmp_path / "r1", "r1", data=True)
    r1 = replica(api, lease, "r1", single, clock)
    await r1.step()
    clock.now += 3 * DURATION
    await r1.step()  # in the in-sync set by name, but it holds single-node data
    assert r1.state.role == "standby" and single.set_id == ""


async def test_a_lease_from_before_set_ids_gets_the_holder_s_on_its_next_renewal(
    api, lease, tmp_path
) -> None:
    client = LeaseClient(lease, api.url)
    try:
        await client.create(LeaseRecord(holder="r0", term=2, positions={"r0": (2, 30)}))
    finally:
        await client.close()
    assert "streams.pyds.dev/set-id" not in annotations(api, lease)
    old = identity(tmp_path / "r0", "r0", data=True, positioned=True)  # no id file
    r0 = replica(api, lease, "r0", old, Clock(), position=(2, 30))
    await r0.step()  # its own Lease, taken back (term 3): with an id minted now
    await r0.step()  # a renewal
    assert r0.state.role == "primary" and len(old.set_id) == 32
    assert old.layout.read_set_id() == old.set_id
    assert annotations(api, lease)["streams.pyds.dev/set-id"] == old.set_id
    # And a standby from before set ids adopts it before it follows.
    standby = identity(tmp_path / "r1", "r1", data=True, positioned=True)
    assert await standby.join(old.set_id) is None
    assert standby.layout.read_set_id() == old.set_id


def test_the_lease_record_carries_the_set_id() -> None:
    record = LeaseRecord(holder="a", term=1, set_id=SET_X)
    obj = record.to_object("ns", "l")
    assert obj["metadata"]["annotations"]["streams.pyds.dev/set-id"] == SET_X
    assert LeaseRecord.from_object(obj).set_id == SET_X
    bare = LeaseRecord(holder="a", term=1).to_object("ns", "l")
    assert "streams.pyds.dev/set-id" not in bare["metadata"]["annotations"]
    assert LeaseRecord.from_object(bare).set_id == ""
