"""A consistent copy of a data directory, as a tar: what a standby re-copies from its
primary (``replication/recopy.py``) and what a base backup uploads (``archive/backup/base_backup.py``).

The tar holds the version file, the set id file when there is one (so the copy
belongs to the primary's set, docs/replication.md "A set's identity"), an LMDB
copy (one read transaction, so one batch boundary) as ``meta/data.mdb``, and each
stream's segment file up to the tail that copy records (a log kept inline is in the
LMDB copy already). Bytes below a committed
tail never change, except that retention may punch them; a copy during which a
retained start moved is taken again (the sink is told to throw the attempt away).
The WAL is not copied: everything it holds is in LMDB and the segment files.

The tar is written to a *sink* as a stream (no seek), so that a backup can cut it
into parts as it goes and never hold the whole of it on disk; every file's size and
CRC-32 are reported, and the copy's position:

- in a replica set, the LMDB copy's ``replica_position`` (term, lsn): the copy is
  exactly the state after that frame (start = end);
- on a single node that archives, the copy's ``archive_lsn`` (the lsn its batches
  write into LMDB with them): exact too, under term 0;
- on a single node that keeps no lsn in LMDB, the engine's ``meta_lsn`` (the last
  frame LMDB holds all of: a batch's tails may wait for a later batch's transaction,
  ``engine/meta_writes.py``) read just before the copy, and its lsn just after it:
  the copy holds every frame up to ``start_lsn`` and none past ``end_lsn``. Frames
  replay idempotently (whole values, positional writes), so a restore replays from
  ``start_lsn + 1`` and must reach at least ``end_lsn``.
"""

from __future__ import annotations

import os
import struct
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from stream_format.layout import LMDB_DATA
from stream_format.meta import DB_INFO, DB_INLINE, DB_TAILS, decode_tail, key_stream_id
from stream_format.records import crc32
from stream_server.engine import fsio
from stream_server.engine.engine import Engine
from stream_server.engine.metadata import Metadata
from stream_server.engine.replica import KEY_POSITION, POSITION

ATTEMPTS = 5
# A single node that archives writes its lsn into each batch (the archiver's
# ``engine/wal_keep.py``, ``KEY_LSN``): its copy's position is then exact too.
KEY_SINGLE_NODE_LSN = b"archive_lsn"
SINGLE_NODE_LSN = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class CopiedFile:
    path: str  # inside the data directory, as in the tar
    size: int
    crc32: int


@dataclass(slots=True)
class Snapshot:
    """Where a copy stands (``term``, ``start_lsn``, ``end_lsn``) and what it holds."""

    term: int = 0
    start_lsn: int = 0
    end_lsn: int = 0
    files: list[CopiedFile] = field(default_factory=list)


class Sink(Protocol):
    """Where the tar goes."""

    def begin(self, snapshot: Snapshot) -> None:
        """An attempt starts: its position is known, no byte written yet."""

    def write(self, data: bytes) -> int: ...

    def discard(self) -> None:
        """The attempt's bytes are thrown away (a retained start moved meanwhile)."""


class FileSink:
    """The tar in one local file (a re-copy serves it whole)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def begin(self, snapshot: Snapshot) -> None:
        pass

    def write(self, data: bytes) -> int:
        return self.f.write(data)

    def discard(self) -> None:
        self.f.seek(0)
        self.f.truncate()


def build(engine: Engine, out: Path) -> Snapshot:
    """Write the tar to the file ``out``. Runs on a worker thread, beside the writer."""
    with out.open("wb") as f:
        return build_into(engine, FileSink(f))


def build_into(engine: Engine, sink: Sink) -> Snapshot:
    """Write the tar to ``sink``; taken again (up to ``ATTEMPTS`` times) while
    retention moves a start under it. Runs on a worker thread, beside the writer."""
    for _ in range(ATTEMPTS):
        snapshot = _build_once(engine, sink)
        if snapshot is not None:
            return snapshot
        sink.discard()
    raise RuntimeError("retention kept moving while the copy was taken; try again")


def _build_once(engine: Engine, sink: Sink) -> Snapshot | None:
    layout = engine.layout
    with tempfile.TemporaryDirectory(dir=layout.root, prefix=".snapshot-") as tmp:
        meta_copy = Path(tmp) / "meta"
        meta_copy.mkdir()
        assert engine.meta is not None
        before = engine.meta_lsn
        engine.meta.env.copy(str(meta_copy))
        after = engine.lsn
        snapshot, tails, inline = _read_copy(meta_copy, engine.map_size)
        if snapshot is None:  # a single node: no position in LMDB
            snapshot = Snapshot(0, before, after)
        sink.begin(snapshot)
        with tarfile.open(fileobj=sink, mode="w|") as tar:  # type: ignore[call-overload]
            _add(tar, snapshot, layout.version_file, layout.version_file.name)
            if layout.set_id_file.exists():  # a primary from before set ids has none yet
                _add(tar, snapshot, layout.set_id_file, layout.set_id_file.name)
            meta_dir = tarfile.TarInfo("meta")
            meta_dir.type, meta_dir.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(meta_dir)
            _add(tar, snapshot, meta_copy / LMDB_DATA, f"meta/{LMDB_DATA}")
            for sid, (file_len, _) in tails.items():
                if sid in inline:
                    continue  # its log is in the LMDB copy (format 5)
                path = engine.segments.path(sid)
                try:
                    fd = fsio.open_read(path)
                except FileNotFoundError:
                    return None  # deleted meanwhile: take the copy again
                try:
                    with os.fdopen(os.dup(fd), "rb") as f:
                        name = str(path.relative_to(layout.root))
                        _add_open(tar, snapshot, f, name, file_len)
                finally:
                    fsio.close(fd)
        for sid, (_, start_pos) in tails.items():
            now = engine.tails.get(sid)
            if now is not None and now.start_pos != start_pos:
                return None  # punched while copied: the copy may hold zeros it needs
    return snapshot


def _read_copy(
    meta_copy: Path, map_size: int
) -> tuple[Snapshot | None, dict[int, tuple[int, int]], set[int]]:
    """The copy's replica position (None: it has none), each stream's (file length,
    retained start position), and the streams whose log the copy holds inline."""
    copy = Metadata(meta_copy, map_size)
    try:
        with copy.env.begin() as txn:
            tails = {}
            for k, v in txn.cursor(db=copy.dbs[DB_TAILS]):
                tail = decode_tail(bytes(v))
                tails[key_stream_id(k)] = (tail.file_len, tail.start_pos)
            cur = txn.cursor(db=copy.dbs[DB_INLINE])
            inline = {key_stream_id(k) for k in cur.iternext(values=False)}
            raw = txn.get(KEY_POSITION, db=copy.dbs[DB_INFO])
            single = txn.get(KEY_SINGLE_NODE_LSN, db=copy.dbs[DB_INFO])
    finally:
        copy.env.close()
    if raw is not None:
        term, lsn = POSITION.unpack(bytes(raw))
        return Snapshot(term, lsn, lsn), tails, inline
    if single is not None:
        (lsn,) = SINGLE_NODE_LSN.unpack(bytes(single))
        return Snapshot(0, lsn, lsn), tails, inline
    return None, tails, inline


def _add(tar: tarfile.TarFile, snapshot: Snapshot, path: Path, name: str) -> None:
    with path.open("rb") as f:
        _add_open(tar, snapshot, f, name, os.fstat(f.fileno()).st_size)


def _add_open(tar: tarfile.TarFile, snapshot: Snapshot, f: BinaryIO, name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    reader = _Limited(f, size)
    tar.addfile(info, reader)
    if reader.left:
        raise RuntimeError(f"{name} ended {reader.left} bytes short while copied")
    snapshot.files.append(CopiedFile(name, size, reader.crc))


class _Limited:
    """A file's first ``size`` bytes, as tarfile reads them, with their CRC-32."""

    def __init__(self, f: object, size: int) -> None:
        self.f = f
        self.left = size
        self.crc = 0

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data: bytes = self.f.read(n)  # type: ignore[attr-defined]
        self.left -= len(data)
        self.crc = crc32(data, self.crc)
        return data


def extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract a copy into ``dest``: plain files and directories inside it only.

    Python's ``data`` extraction filter does it where Python has one (3.11.4 and later);
    the server image's Python (Debian bookworm's 3.11.2) has none, and there the same
    rules are checked here before anything is written: a member that is not a regular
    file or directory, or whose path leaves ``dest``, refuses the whole copy. Modes and
    owners in the archive are not applied either way (the files are this process's).
    """
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = dest.resolve()
    members = tar.getmembers()
    for member in members:
        inside = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not inside.is_relative_to(root):
            raise tarfile.TarError(f"a copy holds {member.name!r}: not a file inside it")
    for member in members:
        tar.extract(member, dest, set_attrs=False)
