"""Taking a base backup: the consistent snapshot (``engine/snapshot.py``) uploaded to
the archive as parts of up to 64 MiB, then its manifest, last.

The tar is cut into parts as it is written, so a backup needs no local disk for it
and at most one part in memory; each part is written with ``If-None-Match: *``
under the backup's id (``<UTC time>-<lsn>``), so a backup never replaces another's
objects. The manifest (every part's and every file's size and CRC-32, the lsn
range, the term and term history it belongs to) is written only once every part is there: a backup without one
is unfinished, and nothing lists it or restores from it. A failed backup deletes
the parts it wrote, as far as the store lets it.

Runs on a worker thread beside the writer (the LMDB copy is one read transaction;
the segment files are read up to the tails it records).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stream_format.archive import (
    History,
    backup_id,
    encode_manifest,
    manifest_name,
    part_name,
    rfc3339,
    term_of,
)
from stream_format.layout import DataFormat
from stream_format.records import crc32
from stream_server.archive.backup.catalog import summary
from stream_server.archive.follow_position import single_node_term
from stream_server.archive.object_store import ArchiveError, ObjectStore
from stream_server.engine.engine import Engine
from stream_server.engine.replica import ReplicaHooks
from stream_server.engine.snapshot import Snapshot, build_into

log = logging.getLogger("stream_server.archive")

PART_BYTES = 64 * 1024 * 1024


class BackupFailed(ArchiveError):
    """The backup could not be written (its message says what; the store's own errors
    pass through as they are)."""


class PartUploader:
    """The snapshot's sink: cuts the tar into parts and uploads each as it fills, on
    ``uploader``'s thread while the next part is read (two parts in memory at most)."""

    def __init__(
        self,
        store: ObjectStore,
        part_bytes: int,
        uploader: ThreadPoolExecutor,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.part_bytes = part_bytes
        self.uploader = uploader
        self.clock = clock
        self.id = ""
        self.time = 0.0
        self.parts: list[dict[str, Any]] = []
        self._buffer = bytearray()
        self._uploading: Future[None] | None = None

    def begin(self, snapshot: Snapshot) -> None:
        self.time = self.clock()
        self.id = backup_id(self.time, snapshot.end_lsn)

    def write(self, data: bytes) -> int:
        self._buffer += data
        while len(self._buffer) >= self.part_bytes:
            self._upload(bytes(self._buffer[: self.part_bytes]))
            del self._buffer[: self.part_bytes]
        return len(data)

    def finish(self) -> None:
        """Upload the last part; return once every part is in the store."""
        if self._buffer or not self.parts:
            self._upload(bytes(self._buffer))
            self._buffer.clear()
        self._wait()

    def discard(self) -> None:
        """Delete what this attempt uploaded (best effort: an unfinished backup is never
        listed, only its space is lost)."""
        with contextlib.suppress(Exception):
            self._wait()
        names = [str(p["name"]) for p in self.parts]
        self.parts, self._buffer = [], bytearray()
        with contextlib.suppress(ArchiveError):
            self.store.delete(names)

    def _upload(self, data: bytes) -> None:
        self._wait()  # the part before: its failure stops the backup here
        name = part_name(self.id, len(self.parts) + 1)
        self.parts.append({"name": name, "size": len(data), "crc32": crc32(data)})
        self._uploading = self.uploader.submit(self._put, name, data)

    def _wait(self) -> None:
        uploading, self._uploading = self._uploading, None
        if uploading is not None:
            uploading.result()

    def _put(self, name: str, data: bytes) -> None:
        if not self.store.put_new(name, data):
            raise BackupFailed(f"{name} exists already: another backup has this id")


def belongs_to(engine: Engine, snapshot: Snapshot) -> tuple[int, History]:
    """The term and the term history a backup of ``snapshot`` belongs to, as the archive
    this server writes names them (restore checks the backup is on the archive's newest
    history by its term). A replica set's copy carries its (term, lsn) and the set's
    history; a single node's term is the one its history gives ``start_lsn``: 0, or
    after a promotion the new term once it wrote (``follow_position.single_node_term``),
    never the snapshot's 0."""
    if isinstance(engine.replica, ReplicaHooks):
        term = snapshot.term
        history = list(engine.replica.terms) or [(term, 1)]
    else:
        history = single_node_term(engine)[1]
        term = term_of(history, snapshot.start_lsn)
    upto = [(t, first) for t, first in history if first <= snapshot.end_lsn]
    return term, upto or history[:1]


def take(
    engine: Engine,
    store: ObjectStore,
    *,
    node: str,
    part_bytes: int = PART_BYTES,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Take a base backup of ``engine``'s data into ``store``; its manifest."""
    started = clock()
    with ThreadPoolExecutor(1, thread_name_prefix="backup-upload") as uploader:
        return _take(engine, store, PartUploader(store, part_bytes, uploader, clock), node, started)


def _take(
    engine: Engine, store: ObjectStore, sink: PartUploader, node: str, started: float
) -> dict[str, Any]:
    clock = sink.clock
    try:
        snapshot = build_into(engine, sink)
        sink.finish()
        version = engine.layout.read_version()
        term, history = belongs_to(engine, snapshot)
        manifest = {
            "id": sink.id,
            "data_format": DataFormat.parse(version).write if version else 0,
            "set": engine.layout.read_set_id(),
            "term": term,
            "history": [list(entry) for entry in history],
            "start_lsn": snapshot.start_lsn,
            "end_lsn": snapshot.end_lsn,
            "time": rfc3339(sink.time),
            "started": rfc3339(started),
            "stopped": rfc3339(clock()),
            "node": node,
            "parts": sink.parts,
            "files": [{"path": f.path, "size": f.size, "crc32": f.crc32} for f in snapshot.files],
        }
        if not store.put_new(manifest_name(sink.id), encode_manifest(manifest)):
            raise BackupFailed(f"{manifest_name(sink.id)} exists already")
    except BaseException:
        sink.discard()
        raise
    done = summary(manifest)
    log.info(
        "base backup %s: lsn %d..%d of term %d, %d bytes in %d parts",
        sink.id,
        snapshot.start_lsn,
        snapshot.end_lsn,
        term,
        done["bytes"],
        len(sink.parts),
    )
    return manifest
