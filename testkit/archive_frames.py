"""An archive made by hand, and the archive's commands run as a user runs them: what
the backup, restore and replica-cluster tests need beside a server and a store.

The server's own archiver makes the same objects; these let a test decide exactly
what the archive holds and when: a data directory's WAL frames uploaded
(``upload_wal_frames`` in chunks, ``upload_wal`` as one object after what the archive
holds); any frames under any term with its history (a failover at the source, a
deposed primary's frames) go up with the archiver's own ``archive_end.put_frames``
and ``put_history``.

``upload_wal_frames`` stands in for the server's archiver: it reads the WAL files of
a data directory (a server started with a large ``--checkpoint-bytes`` keeps them
all; copy them first while it runs, ``copy_wal``) and writes their frames as frames
objects of a few frames each, under term 0 with the single node's history
``[[0, 1]]``, in the format package's encoding. A frame's commit time is its
records' timestamp (the batch's time, which the engine stamps each record with); a
frame without records takes the time of the frame before it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stream_format import wal as walmod
from stream_format.archive import (
    SINGLE_NODE_HISTORY,
    ArchivedFrame,
    encode_frames_object,
    encode_history,
    history_name,
    wal_name,
)
from stream_format.meta import DB_INLINE
from stream_format.records import FILE_HEADER_SIZE, CorruptRecord, iter_records
from stream_server.archive.object_store import ObjectStore
from stream_server.archive.upload import archive_end
from stream_server.declared.groups import ArchiveSettings
from testkit.archive_store import S3Store
from testkit.servers import env_with


def store_for(seaweed: S3Store, url: str, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    """An ObjectStore on ``url`` in this process, with the store's credentials."""
    for key, value in seaweed.env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    return ObjectStore(ArchiveSettings(archive_url=url, archive_endpoint=seaweed.endpoint))


def copy_wal(data_dir: Path, dest: Path) -> Path:
    """The WAL files of a running server's directory, copied into ``dest`` (the last may
    end torn). Called again, it copies only what each file gained since, and keeps the
    files a checkpoint has deleted meanwhile: called after each write, it misses no
    frame."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in walmod.wal_files(data_dir / "wal"):
        copy = dest / path.name
        have = copy.stat().st_size if copy.exists() else 0
        try:
            with path.open("rb") as src, copy.open("ab") as out:
                src.seek(have)
                shutil.copyfileobj(src, out)
        except FileNotFoundError:
            continue  # checkpointed meanwhile: what it held is in the copy already
    return dest


def frame_time_us(frame: walmod.Frame, before: int) -> int:
    """The newest record timestamp a frame writes (``before`` when it writes none): in a
    segment write, or in a small log's whole inline value (data format 5)."""
    newest = before
    for entry in frame.entries:
        if entry[0] == walmod.WRITE:
            _, _, pos, data = entry
        elif entry[0] == walmod.PUT and entry[1] == DB_INLINE:
            pos, data = 0, entry[3]
        else:
            continue
        skip = FILE_HEADER_SIZE if pos == 0 else 0
        try:
            for rec in iter_records(data[skip:], pos + skip):
                newest = max(newest, rec.timestamp_us)
        except CorruptRecord:
            continue
    return newest


def wal_frames(wal_dir: Path) -> list[ArchivedFrame]:
    """Every whole frame of the WAL files in ``wal_dir`` (a data directory's ``wal/``, or
    a copy of it), in lsn order; the last file's torn tail (a batch being written by a
    running server) is left out."""
    files = walmod.wal_files(wal_dir)
    out: list[ArchivedFrame] = []
    when = 0
    for i, path in enumerate(files):
        for frame in walmod.read_frames(path, last_file=i == len(files) - 1):
            when = frame_time_us(frame, when)
            out.append(ArchivedFrame(frame.lsn, when, bytes(frame.raw)))
    return out


def upload_wal_frames(
    store: ObjectStore,
    wal_dir: Path,
    *,
    per_object: int = 5,
    after: int = 0,
    upto: int | None = None,
    term: int = 0,
) -> list[ArchivedFrame]:
    """Upload the frames of ``wal_dir`` with lsns in (``after``, ``upto``] as frames
    objects of ``per_object`` frames, under ``term`` (a single node's 0, or a replica
    set's one term), with that term's history beginning at the first frame; the frames
    uploaded."""
    frames = [f for f in wal_frames(wal_dir) if f.lsn > after and (upto is None or f.lsn <= upto)]
    first = 1 if term == 0 else frames[0].lsn
    store.put_new(history_name(term), encode_history(term, [(term, first)]))
    for i in range(0, len(frames), per_object):
        chunk = frames[i : i + per_object]
        assert store.put_new(wal_name(term, chunk[0].lsn), encode_frames_object(term, chunk))
    return frames


def run_command(*args: str, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """``durable-streams-server ARGS`` in a child process: its exit code and JSON output."""
    done = subprocess.run(
        [sys.executable, "-m", "stream_server", *args],
        env=env_with(env),
        capture_output=True,
        timeout=600,
        check=False,
    )
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {"stdout": done.stdout.decode(), "stderr": done.stderr.decode()[-3000:]}
    return done.returncode, doc


def tree(path: Path) -> dict[str, int]:
    """Every file under ``path`` with its size: to show a directory was not touched."""
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): p.stat().st_size
        for p in sorted(path.rglob("*"))
        if p.is_file() or os.path.islink(p)
    }


def copy_objects(seaweed: S3Store, bucket_url: str, src: str, dst: str, under: str = "") -> int:
    """Copy the objects under ``src/under`` to ``dst/under`` in one bucket (s3://NAME); how
    many. The tests restore from a prefix of their own, holding the server's backups
    (``under="backups/"``) and the frames ``upload_wal_frames`` wrote: the server's own
    archiver, where it runs, writes frames objects of its own under the server's prefix.
    A test that damages an archive damages a copy of it."""
    client = seaweed.client()
    bucket = bucket_url.removeprefix("s3://")
    listing = client.get_paginator("list_objects_v2")
    n = 0
    for page in listing.paginate(Bucket=bucket, Prefix=f"{src}/{under}"):
        for item in page.get("Contents", ()):
            key = item["Key"]
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            client.put_object(Bucket=bucket, Key=dst + key[len(src) :], Body=body)
            n += 1
    return n


def upload_wal(data_dir: Path, store: ObjectStore) -> int:
    """The frames of ``data_dir``'s WAL the archive lacks, as one frames object under
    term 0 (with the history ``[[0, 1]]``); the last lsn the archive then holds."""
    archive_end.put_history(store, SINGLE_NODE_HISTORY, 0)
    done = archive_end.archived_end(store, SINGLE_NODE_HISTORY)[0]
    new = [f for f in wal_frames(Path(data_dir) / "wal") if f.lsn > done]
    if not new:
        return done
    assert new[0].lsn == done + 1, f"the WAL starts at {new[0].lsn}, the archive ends at {done}"
    assert archive_end.put_frames(store, 0, new) == new[-1].lsn
    return new[-1].lsn
