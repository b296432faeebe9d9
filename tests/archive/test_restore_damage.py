"""A damaged or missing archive object stops a restore with an error naming it, and leaves
``--data-dir`` as it was (absent, or empty) with nothing half-restored beside it.

The backup here is taken in-process (``archive.backup.base_backup.take`` on the engine of a
stopped server's directory) with small parts, so that it has several; the server
then writes on, and its WAL frames go to the archive as frames objects of a few
frames each. Each test damages a copy of that archive.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from stream_format.archive import manifest_name
from stream_server.archive.backup import base_backup
from stream_server.engine.engine import Engine
from testkit.archive_frames import (
    copy_objects,
    copy_wal,
    run_command,
    store_for,
    tree,
    upload_wal_frames,
)
from testkit.archive_store import S3Store
from testkit.server_process import ServerProcess
from testkit.stream_kinds import StreamKinds

pytestmark = pytest.mark.processes

PART_BYTES = 16 * 1024


@dataclass
class Archive:
    bucket: str
    env: dict[str, str]
    manifest: dict
    wal_objects: list[str]
    kinds: StreamKinds
    copies: int = 0

    def copy(self, archive_store: S3Store) -> str:
        """A copy of the whole archive, to damage: its prefix."""
        self.copies += 1
        prefix = f"copy-{self.copies}"
        copy_objects(archive_store, self.bucket, "good", prefix)
        return prefix


@pytest.fixture(scope="module")
def archive(archive_store: S3Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archive]:
    bucket, env = archive_store.new_bucket(), archive_store.env()
    root = tmp_path_factory.mktemp("damage")
    kinds = StreamKinds()
    srv = ServerProcess(root / "data", env=env).start()
    with httpx.Client(timeout=10) as c:
        for _ in range(3):
            kinds.write_round(c, srv.url)
    srv.stop()
    with pytest.MonkeyPatch.context() as mp:
        store = store_for(archive_store, f"{bucket}/good", mp)
        engine = Engine(srv.data_dir)
        engine.open()
        try:
            manifest = base_backup.take(engine, store, node="test", part_bytes=PART_BYTES)
        finally:
            engine.close()
        srv = ServerProcess(srv.data_dir, env=env).start()
        try:
            with httpx.Client(timeout=10) as c:
                for _ in range(3):
                    kinds.write_round(c, srv.url)
            wal = copy_wal(srv.data_dir, root / "wal")
        finally:
            srv.stop()
        upload_wal_frames(store, wal, per_object=3)
        names = [n for n, _ in store.objects("wal/")]
    assert len(manifest["parts"]) >= 3 and len(names) >= 3
    yield Archive(bucket, env, manifest, names, kinds)


def restore(
    archive: Archive, archive_store: S3Store, prefix: str, data_dir: Path
) -> tuple[int, dict]:
    before = tree(data_dir)
    code, done = run_command(
        "restore",
        "--archive-url",
        f"{archive.bucket}/{prefix}",
        "--archive-endpoint",
        archive_store.endpoint,
        "--data-dir",
        str(data_dir),
        env=archive.env,
    )
    if code != 0:
        assert tree(data_dir) == before, "a failed restore changed --data-dir"
        assert [p.name for p in data_dir.parent.iterdir() if p.name.startswith(".")] == []
    return code, done


def test_the_good_archive_restores_from_several_parts(archive, archive_store, tmp_path) -> None:
    code, done = restore(archive, archive_store, "good", tmp_path / "ok")
    assert code == 0, done
    srv = ServerProcess(tmp_path / "ok").start()
    try:
        with httpx.Client(timeout=10) as c:
            assert archive.kinds.primary_differences(c, srv.url) == []
    finally:
        srv.stop()


def put(archive_store: S3Store, archive: Archive, key: str, body: bytes) -> None:
    archive_store.client().put_object(Bucket=archive.bucket[5:], Key=key, Body=body)


def get(archive_store: S3Store, archive: Archive, key: str) -> bytes:
    data: bytes = (
        archive_store.client().get_object(Bucket=archive.bucket[5:], Key=key)["Body"].read()
    )
    return data


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]


@pytest.mark.parametrize("damage", ["truncated", "altered", "missing"])
def test_a_damaged_backup_part_is_named(archive, archive_store, tmp_path, damage) -> None:
    prefix = archive.copy(archive_store)
    name = archive.manifest["parts"][1]["name"]
    key = f"{prefix}/{name}"
    data = get(archive_store, archive, key)
    if damage == "truncated":
        put(archive_store, archive, key, data[: len(data) // 2])
    elif damage == "altered":
        put(archive_store, archive, key, flipped(data, len(data) // 3))
    else:
        archive_store.client().delete_object(Bucket=archive.bucket[5:], Key=key)
    target = tmp_path / "new"
    target.mkdir()  # an empty directory given: it stays empty
    code, done = restore(archive, archive_store, prefix, target)
    assert code == 1
    assert name in done["error"]
    want = {"truncated": "bytes", "altered": "checksum", "missing": "NoSuchKey"}[damage]
    assert want in done["error"]


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_a_damaged_frames_object_is_named(archive, archive_store, tmp_path, damage) -> None:
    prefix = archive.copy(archive_store)
    name = archive.wal_objects[1]
    key = f"{prefix}/{name}"
    data = get(archive_store, archive, key)
    put(
        archive_store,
        archive,
        key,
        data[:-7] if damage == "truncated" else flipped(data, len(data) - 9),
    )
    code, done = restore(archive, archive_store, prefix, tmp_path / "absent")
    assert code == 1
    assert name in done["error"] and not (tmp_path / "absent").exists()


def test_a_missing_frames_object_is_a_gap_named_by_its_lsns(
    archive, archive_store, tmp_path
) -> None:
    prefix = archive.copy(archive_store)
    name = archive.wal_objects[1]
    archive_store.client().delete_object(Bucket=archive.bucket[5:], Key=f"{prefix}/{name}")
    code, done = restore(archive, archive_store, prefix, tmp_path / "absent")
    assert code == 1
    assert "misses frames" in done["error"] and not (tmp_path / "absent").exists()


def test_a_file_that_does_not_match_its_manifest_is_named(archive, archive_store, tmp_path) -> None:
    """Parts that check but a file whose size or CRC-32 is not the manifest's (a backup
    written by a broken program): the file is named."""
    prefix = archive.copy(archive_store)
    key = f"{prefix}/{manifest_name(archive.manifest['id'])}"
    manifest = json.loads(get(archive_store, archive, key))
    entry = next(f for f in manifest["files"] if f["path"] == "meta/data.mdb")
    entry["crc32"] ^= 1
    put(archive_store, archive, key, json.dumps(manifest).encode())
    code, done = restore(archive, archive_store, prefix, tmp_path / "absent")
    assert code == 1
    assert entry["path"] in done["error"] and "CRC-32" in done["error"]
