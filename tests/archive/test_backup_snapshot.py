"""The snapshot a base backup uploads, in-process on a real engine: where the copy stands
(a replica set's position, a single node's archived lsn, or the lsns around the copy),
every file's size and CRC-32, and the tar cut into parts exactly as written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from stream_format import wal as walmod
from stream_format.meta import DB_INFO
from stream_format.records import KIND_BYTES, crc32
from stream_server.engine import Engine
from stream_server.engine.ops import Append
from stream_server.engine.replica import KEY_POSITION, POSITION
from stream_server.engine.snapshot import KEY_SINGLE_NODE_LSN, SINGLE_NODE_LSN, Snapshot, build_into
from testkit.engines import new_stream


class Parts:
    """A sink cutting the tar into parts of ``size`` bytes, in memory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.parts: list[bytes] = []
        self.buffer = b""
        self.begun: list[Snapshot] = []

    def begin(self, snapshot: Snapshot) -> None:
        self.begun.append(snapshot)

    def write(self, data: bytes) -> int:
        self.buffer += data
        while len(self.buffer) >= self.size:
            self.parts.append(self.buffer[: self.size])
            self.buffer = self.buffer[self.size :]
        return len(data)

    def discard(self) -> None:
        self.parts, self.buffer = [], b""


def engine_with_data(root: Path) -> Engine:
    engine = Engine(root)
    engine.open()
    new_stream(engine, "a", 1)
    new_stream(engine, "b", 2)
    for i in range(20):
        engine.commit([Append(1 + i % 2, KIND_BYTES, [f"record {i} ".encode() * 50])])
    return engine


def test_a_single_node_copy_stands_between_the_lsns_around_it(tmp_path) -> None:
    engine = engine_with_data(tmp_path / "d")
    try:
        sink = Parts(4096)
        snapshot = build_into(engine, sink)
    finally:
        engine.close()
    assert (snapshot.term, snapshot.start_lsn, snapshot.end_lsn) == (0, 22, 22)
    tar_bytes = b"".join(sink.parts) + sink.buffer
    assert all(len(p) == 4096 for p in sink.parts) and len(sink.parts) >= 3
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert set(files) == {f.path for f in snapshot.files}
    for f in snapshot.files:
        assert (len(files[f.path]), crc32(files[f.path])) == (f.size, f.crc32)
    assert sum(p.startswith("segments/") for p in files) == 2


def test_a_single_node_copy_with_tails_waiting_starts_where_lmdb_stands(tmp_path) -> None:
    """A batch's tails may wait for a later LMDB transaction (engine/meta_writes.py): the
    copy holds LMDB's state, so it starts at the last frame LMDB holds all of."""
    engine = engine_with_data(tmp_path / "d")
    try:
        lengths = {engine.tails[1].file_len, engine.tails[2].file_len}
        engine.commit([Append(1, KIND_BYTES, [b"waits"])], lambda: True)  # frame 23
        assert engine.meta_lsn == 22
        snapshot = build_into(engine, Parts(1 << 20))
    finally:
        engine.close()
    assert (snapshot.start_lsn, snapshot.end_lsn) == (22, 23)
    # Each file up to the tail LMDB's copy names: without the bytes whose tail waited.
    assert {f.size for f in snapshot.files if f.path.startswith("segments/")} == lengths


def test_a_copy_with_a_position_stands_exactly_there(tmp_path) -> None:
    engine = engine_with_data(tmp_path / "d")
    try:
        engine.write_metadata([(walmod.PUT, DB_INFO, KEY_POSITION, POSITION.pack(3, 17))])
        at_position = build_into(engine, Parts(1 << 20))
        engine.write_metadata([(walmod.DELETE, DB_INFO, KEY_POSITION)])
        engine.write_metadata(
            [(walmod.PUT, DB_INFO, KEY_SINGLE_NODE_LSN, SINGLE_NODE_LSN.pack(40))]
        )
        archived = build_into(engine, Parts(1 << 20))
    finally:
        engine.close()
    assert (at_position.term, at_position.start_lsn, at_position.end_lsn) == (3, 17, 17)
    assert (archived.term, archived.start_lsn, archived.end_lsn) == (0, 40, 40)
