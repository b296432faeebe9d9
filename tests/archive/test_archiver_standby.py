"""The archiver in-process on a real data directory and a real SeaweedFS: a standby
uploads nothing and deletes its spooled WAL once the archive (another's uploads)
holds it; the primary deletes what it archived."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_format.records import KIND_BYTES
from stream_server.archive.object_store import ObjectStore
from stream_server.archive.upload import archive_end
from stream_server.archive.upload.archiver import Archiver
from stream_server.archive.upload.wal_source import WalSource
from stream_server.declared.groups import ArchiveSettings
from stream_server.engine import Engine
from stream_server.engine.ops import Append
from stream_server.engine.wal_keep import spooled_files
from testkit import wait_for
from testkit.archive_store import S3Store, object_store
from testkit.engines import crash, new_stream, settled

pytestmark = pytest.mark.processes

HISTORY = [(0, 1)]
SETTINGS = ArchiveSettings(
    archive_timeout=0.2, archive_object_bytes=1 << 20, archive_max_pending_bytes=1 << 30
)


@pytest.fixture
def store(archive_store: S3Store) -> ObjectStore:
    return object_store(archive_store, archive_store.new_bucket())


def spooled_engine(path: Path) -> Engine:
    """An engine whose checkpoints spooled several WAL files (nothing archived yet)."""
    engine = Engine(path, checkpoint_bytes=2048, archive_floor=lambda: 0)
    engine.open()
    new_stream(engine, "/a", 1)
    for i in range(40):
        engine.commit([Append(1, KIND_BYTES, [b"%04d" % i * 50])])
        settled(engine)  # each checkpoint runs (one finding another running would skip)
    assert len(spooled_files(engine.layout)) >= 3
    return engine


def test_a_standby_deletes_its_spool_once_the_archive_holds_it(
    tmp_path: Path, store: ObjectStore
) -> None:
    engine = spooled_engine(tmp_path)
    archiver = Archiver(
        engine.layout, store, SETTINGS, published=lambda: engine.lsn, history=lambda: HISTORY
    )
    archiver.start("standby")
    try:
        wait_for(lambda: archiver.progress.pending_bytes > 0)
        assert spooled_files(engine.layout) and not list(store.objects("wal/"))
        # The primary archives (here by hand): every frame this standby holds.
        frames = [r.frame for r in WalSource(engine.layout, 0).read(engine.lsn, 1 << 30)]
        archive_end.put_history(store, HISTORY, 0)
        archive_end.put_frames(store, 0, frames)
        wait_for(lambda: not spooled_files(engine.layout), message="the spool emptied")
        assert archiver.progress.archived_lsn == engine.lsn
        assert archiver.progress.role == "standby" and not archiver.progress.failing
    finally:
        archiver.stop(wait=10)
        crash(engine)


def test_the_primary_archives_then_deletes_the_spool(tmp_path: Path, store: ObjectStore) -> None:
    engine = spooled_engine(tmp_path)
    archiver = Archiver(
        engine.layout,
        store,
        SETTINGS,
        published=lambda: engine.published_lsn,
        history=lambda: HISTORY,
    )
    archiver.start("archiving")
    try:
        wait_for(
            lambda: (
                archiver.progress.archived_lsn == engine.lsn and not spooled_files(engine.layout)
            )
        )
        assert archiver.progress.lag_frames == 0 and archiver.progress.uploads >= 1
        assert (engine.layout.root / "archive" / "archived").read_text().strip() == str(engine.lsn)
    finally:
        archiver.stop(wait=10)
        crash(engine)


def test_frames_in_no_local_file_are_named_as_a_gap(tmp_path: Path, store: ObjectStore) -> None:
    engine = spooled_engine(tmp_path)
    oldest = spooled_files(engine.layout)[0]
    oldest.unlink()  # as if written while the server ran without --archive-url
    archiver = Archiver(
        engine.layout,
        store,
        SETTINGS,
        published=lambda: engine.published_lsn,
        history=lambda: HISTORY,
    )
    archiver.start("archiving")
    try:
        wait_for(lambda: archiver.progress.archived_lsn == engine.lsn)
        error = archiver.progress.last_error or ""
        assert error.startswith("frames 1..") and "new base backup" in error, error
    finally:
        archiver.stop(wait=10)
        crash(engine)
