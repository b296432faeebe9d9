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

from conftest import ServerProcess, read_all
from stream_format.layout import Layout
from stream_format.meta import ALL_DB_NAMES
from testkit.cluster import Cluster
from testkit.replicaset import ReplicaSet
from tests.replication.conftest import STEADY, StartSet, primary_with_standbys, status, until

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


def member(
    server_factory, api: Cluster, lease: str, name: str, data_dir: Path
) -> ServerProcess:  # fmt: skip
    """A server of the set ``default/<lease>`` (3 replicas) on ``data_dir``."""
    srv = server_factory(data_dir=data_dir)
    srv.args += [
        "--replication-lease", f"default/{lease}",
        "--replica-name", name,
        "--replica-url", srv.url,
        "--kube-api", api.url,
        "--replication-set-size", "3",
        *STEADY,
    ]  # fmt: skip
    return srv.start()


def lease_set_id(api: Cluster, name: str) -> str:
    return api.get("Lease", "default", name)["metadata"]["annotations"][LEASE_NOTE]


def never_joins(api: Cluster, lease: str, servers: list[ServerProcess], name: str) -> None:
    """``name`` stays out of the set for several seconds: not in the Lease's in-sync
    set, and never heard from by the primary (no fetch, no stream)."""
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
