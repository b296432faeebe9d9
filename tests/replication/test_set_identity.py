"""A replica set's identity, real processes (docs/replication.md, "A set's identity").

Data that was acknowledged wins over an empty newcomer: a single server scaled up
to a set keeps every byte (it leads, the new replicas copy from it), however the
pods start. A replica whose data directory holds another set's history, or
single-node data, never joins a set: it says why, is never in sync, and its data
is left as it was.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import httpx
import lmdb
import pytest

from stream_format.layout import Layout
from stream_format.meta import ALL_DB_NAMES
from testkit.cluster import Cluster
from testkit.replica_set_processes import (
    STEADY,
    StartSet,
    primary_with_standbys,
    start_member,
    status,
    until,
)
from testkit.replicaset import ReplicaSet
from testkit.server_process import ServerProcess
from testkit.stream_reads import read_all

pytestmark = pytest.mark.processes

BIN = {"Content-Type": "application/octet-stream"}
LEASE_NOTE = "streams.pyds.dev/set-id"
TIMINGS = {
    "lease_duration": "15",
    "lease_renew_deadline": "10",
    "lease_retry_period": "0.3",
    "replication_wait": "10",
}


def write_streams(base: str, tag: str, streams: int = 3, appends: int = 4) -> dict[str, bytes]:
    """Streams ``<tag>-i`` with a few appends each (the last one closed); their bytes."""
    written: dict[str, bytes] = {}
    with httpx.Client(timeout=30) as c:
        for i in range(streams):
            path = f"{tag}-{i}"
            assert c.put(f"{base}{path}", headers=BIN).status_code == 201
            body = b""
            for j in range(appends):
                chunk = f"{tag} {i}.{j};".encode()
                assert c.post(f"{base}{path}", headers=BIN, content=chunk).status_code in (200, 204)
                body += chunk
            written[path] = body
        closed = f"{base}{tag}-{streams - 1}"
        assert c.post(closed, headers={**BIN, "Stream-Closed": "true"}).status_code in (200, 204)
    return written


def served(base: str, written: dict[str, bytes]) -> bool:
    """Whether every stream reads back exactly (a standby serves up to the commit point)."""
    try:
        return all(read_all(f"{base}{p}") == body for p, body in written.items())
    except AssertionError:
        return False


def fingerprint(data_dir: Path) -> dict[str, str]:
    """What a data directory holds: the FORMAT and SET_ID files, each segment file, and
    every LMDB database's content (read with the server stopped)."""
    layout = Layout(data_dir)
    out = {p.name: p.read_text() for p in (layout.version_file, layout.set_id_file) if p.exists()}
    for path in sorted(layout.segments.rglob("*.log")):
        out[str(path.relative_to(data_dir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    env = lmdb.open(str(layout.meta), readonly=True, lock=False, max_dbs=len(ALL_DB_NAMES) + 2)
    try:
        with env.begin() as txn:
            for name in ALL_DB_NAMES.values():
                db = env.open_db(name, txn=txn, create=False)
                digest = hashlib.sha256()
                for k, v in txn.cursor(db=db):
                    digest.update(bytes(k) + b"\0" + bytes(v) + b"\1")
                out[f"lmdb:{name.decode()}"] = digest.hexdigest()
    finally:
        env.close()
    return out


def member(server_factory, api: Cluster, lease: str, name: str, data_dir: Path) -> ServerProcess:
    """A server of the set ``default/<lease>`` (3 replicas) on ``data_dir``."""
    return start_member(server_factory, api, lease, name, timings=STEADY, data_dir=data_dir)


def lease_set_id(api: Cluster, name: str) -> str:
    return api.get("Lease", "default", name)["metadata"]["annotations"][LEASE_NOTE]


def never_joins(api: Cluster, lease: str, servers: list[ServerProcess], name: str) -> None:
    """``name`` stays out of the set for several seconds: not in the Lease's in-sync
    set, and never heard from by the primary (no stream)."""
    primary = primary_with_standbys(servers, 1)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        st = status(primary)
        assert name not in st["in_sync"] and name not in st["followers"], st
        notes = api.get("Lease", "default", lease)["metadata"]["annotations"]
        assert name not in notes["streams.pyds.dev/in-sync"], notes
        time.sleep(0.3)


def test_a_single_server_scaled_up_to_a_set_keeps_its_data(server_factory, tmp_path: Path):
    """The defect of issue 24, item 8: the new, empty replicas start first (as a
    StatefulSet with parallel pods may start them); one of them used to create the
    Lease and lead with empty storage, and every byte written before answered 404."""
    root = tmp_path / "rs"
    root.mkdir()
    single = server_factory(data_dir=root / "ds-0").start()
    before = write_streams(single.base, "before")
    single.stop()
    rs = ReplicaSet.up(3, root, settings=TIMINGS, order=(1, 2, 0))
    try:
        primary = rs.primary()
        assert primary.name == "ds-0", rs.statuses()
        until(
            "both standbys in sync",
            lambda: len((rs.status("ds-0") or {}).get("in_sync", [])) == 2,
            timeout=90,
        )
        for s in rs.servers:  # the primary, and each standby once in sync (copied)
            until(f"{s.name} serves the old data", lambda s=s: served(s.base, before))
        after = write_streams(primary.base, "after", streams=2)
        for s in rs.servers:
            until(f"{s.name} serves the new data", lambda s=s: served(s.base, after))
        ids = {Layout(Path(s.data_dir)).read_set_id() for s in rs.servers}
        assert ids == {rs.status("ds-0")["set_id"]}  # type: ignore[index]
        assert len(ids.pop()) == 32
    finally:
        rs.down()


def test_a_replica_of_another_set_refuses_to_join(
    server_factory, api: Cluster, start_set: StartSet
) -> None:
    # Set X: one replica, some writes, then stopped; its directory is set X's.
    (x,) = start_set("id-x", count=1)
    until("x primary", lambda: status(x)["role"] == "primary")
    write_streams(x.base, "x", streams=4, appends=6)
    x_id = status(x)["set_id"]
    x.stop()
    kept = fingerprint(x.data_dir)
    assert kept["SET_ID"] == x_id + "\n"
    # Set Y: two of its three replicas, then X's directory started as Y's third.
    servers = start_set("id-y", count=2, set_size=3)
    primary = primary_with_standbys(servers, 1)
    write_streams(primary.base, "y")
    y_id = lease_set_id(api, "id-y")
    assert y_id != x_id
    stranger = member(server_factory, api, "id-y", "r2", x.data_dir)
    until(
        "the stranger says why it does not join",
        lambda: f"set {x_id}'s data" in (status(stranger)["problem"] or ""),
    )
    st = status(stranger)
    assert f"cannot join set {y_id}" in st["problem"] and st["role"] == "standby"
    logged = stranger.log_path.read_text()
    assert f"ERROR   stream_server.replication: this data directory holds set {x_id}'s" in logged
    never_joins(api, "id-y", servers, "r2")
    stranger.stop()
    assert fingerprint(x.data_dir) == kept  # nothing wiped, nothing applied


def test_single_node_data_refuses_to_join_a_set_with_other_data(
    server_factory, api: Cluster, start_set: StartSet
) -> None:
    single = server_factory().start()
    write_streams(single.base, "single", streams=2, appends=8)
    single.stop()
    kept = fingerprint(single.data_dir)
    assert "SET_ID" not in kept
    servers = start_set("id-single", count=2, set_size=3)
    primary = primary_with_standbys(servers, 1)
    write_streams(primary.base, "y")
    newcomer = member(server_factory, api, "id-single", "r2", single.data_dir)
    until(
        "the newcomer says why it does not join",
        lambda: "holds single-node data" in (status(newcomer)["problem"] or ""),
    )
    never_joins(api, "id-single", servers, "r2")
    newcomer.stop()
    assert fingerprint(single.data_dir) == kept


# ------------------------------------------- a member scaled down to one, and back up


def append_alone(base: str, written: dict[str, bytes], tag: str) -> dict[str, bytes]:
    """Appends to streams the set already had (the set's other replicas hold them,
    shorter), as a single node scaled down from the set makes them; the new bodies."""
    out = {}
    with httpx.Client(timeout=30) as c:
        for path, body in written.items():
            chunk = f"{tag} {path};".encode()
            r = c.post(f"{base}{path}", headers=BIN, content=chunk)
            if r.status_code == 409:  # the closed one
                out[path] = body
                continue
            assert r.status_code in (200, 204), r.text
            out[path] = body + chunk
    return out


def scaled_down_to_one(
    server_factory, start_set: StartSet, lease: str, count: int
) -> tuple[list[ServerProcess], str, dict[str, bytes]]:
    """A set of ``count`` with writes in sync everywhere, all stopped; then r0's
    directory served alone by a single node (no Lease), which writes more, to new
    streams and to the set's. Returns the set's servers (stopped), its id and every
    stream's content as r0's directory now holds it."""
    servers = start_set(lease, count=count)
    primary = primary_with_standbys(servers, count - 1)
    written = write_streams(primary.base, "x")
    for i, s in enumerate(servers):
        until(f"r{i} serves the set's data", lambda s=s: served(s.base, written))
    x_id = status(primary)["set_id"]
    for s in servers:
        s.stop()
    single = server_factory(data_dir=servers[0].data_dir).start()
    written = append_alone(single.base, written, "alone")
    written |= write_streams(single.base, "alone", streams=2)
    single.stop()
    return servers, x_id, written


def test_a_member_scaled_down_to_one_leaves_its_set(
    server_factory, api: Cluster, start_set: StartSet
) -> None:
    """Served alone, set X's member leaves X before it writes, and says so; started
    against X's Lease again (kept), it refuses X and its directory is left as it is.
    The old code took it for X's member at its old position and led X again."""
    (x,), x_id, written = scaled_down_to_one(server_factory, start_set, "leave-kept", 1)
    kept = fingerprint(x.data_dir)
    assert lease_set_id(api, "leave-kept") == x_id  # the operator kept the Lease
    again = member(server_factory, api, "leave-kept", "r0", x.data_dir)
    until(
        "r0 refuses its old set, or leads it",
        lambda: status(again)["problem"] or status(again)["role"] == "primary",
    )
    st = status(again)
    assert st["role"] == "standby", f"r0 leads set {x_id} again: {st}"
    assert f"holds single-node data; it cannot join set {x_id}" in st["problem"], st
    # Following no primary, it vouches for no read (docs/replication.md, "Reads"): what
    # it wrote alone stays on its volume, as the fingerprint below shows.
    r = httpx.get(f"{again.base}{next(iter(written))}?offset=-1", timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "STALE_REPLICA", r.text
    again.stop()
    assert fingerprint(x.data_dir) == kept
    assert "SET_ID" not in kept
    logged = x.log_path.read_text()
    left = f"WARNING stream_server.replication: this data directory left replica set {x_id}"
    assert left in logged


def test_a_stale_member_is_never_in_sync_with_a_member_written_to_alone(
    server_factory, api: Cluster, start_set: StartSet
) -> None:
    """The defect of issue 24 (3 -> 1 -> 3): r0 served alone, then the set came back,
    its Lease deleted, r1 on its old directory of X, r2 on a new one. The old code
    recreated X's Lease at r0's old position, and r1, at that same position, was
    counted in sync without anything r0 wrote alone. Now r0 starts a new set with its
    data, r1 (X's) refuses it and is never in sync, r2 copies everything."""
    lease = "leave-stale"
    servers, x_id, written = scaled_down_to_one(server_factory, start_set, lease, 3)
    assert api.delete("Lease", "default", lease).status_code == 200
    r0 = member(server_factory, api, lease, "r0", servers[0].data_dir)
    until("r0 leads a set with its data", lambda: status(r0)["role"] == "primary")
    r1 = member(server_factory, api, lease, "r1", servers[1].data_dir)  # X's, stale
    r2 = member(server_factory, api, lease, "r2", servers[2].data_dir.with_name("r2-new"))

    def in_sync_check() -> bool:
        st = status(r0)
        if "r1" in st["in_sync"]:
            pytest.fail(
                f"r1 is counted in sync ({st['in_sync']}, position {status(r1)['durable']}) "
                f"and serves what r0 wrote alone: {served(r1.base, written)}"
            )
        return "r2" in st["in_sync"]

    until("r2 in sync (and r1 never)", in_sync_check, timeout=90)
    y_id = lease_set_id(api, lease)
    assert y_id != x_id and status(r0)["set_id"] == y_id  # a new set, from r0's data
    until(
        "r1 says why it does not join",
        lambda: f"set {x_id}'s data" in (status(r1)["problem"] or ""),
    )
    assert f"cannot join set {y_id}" in status(r1)["problem"]
    never_joins(api, lease, [r0, r2], "r1")
    assert served(r0.base, written)  # every byte r0 wrote, alone or in X
    until("r2 serves every byte r0 holds", lambda: served(r2.base, written))
