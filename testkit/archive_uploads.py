"""An archive made by hand, for tests of what reads one: a running single node's WAL
frames uploaded as frames objects under term 0 (``upload_wal``), or any frames
under any term with its history (``put_frames``, ``put_history``: a failover at
the source, a deposed primary's frames).

The server's own archiver makes the same objects; these let a test decide exactly
what the archive holds and when. ``upload_wal`` reads the WAL of a server that is
still running (a clean stop checkpoints it away): the last file's torn tail, a
batch being written, is left for the next call.
"""

from __future__ import annotations

import time
from pathlib import Path

from stream_format import wal as walmod
from stream_format.archive import HEADER_SIZE as OBJECT_HEADER_SIZE
from stream_format.archive import (
    WAL_PREFIX,
    ArchivedFrame,
    History,
    decode_header,
    encode_frames_object,
    encode_history,
    history_name,
    parse_wal_name,
    wal_name,
)
from stream_server.archive.object_store import ObjectStore


def archived_last_lsn(store: ObjectStore, term: int) -> int:
    """The last lsn the archive holds under ``term`` (0: none)."""
    names = [n for n, _ in store.objects(f"{WAL_PREFIX}{term:016x}-")]
    if not names:
        return 0
    head = store.get_range(names[-1], 0, OBJECT_HEADER_SIZE)
    return decode_header(names[-1], head)[2]


def wal_frames(data_dir: Path) -> list[ArchivedFrame]:
    """Every whole frame in ``data_dir``'s WAL files, in lsn order, stamped now."""
    files = walmod.wal_files(Path(data_dir) / "wal")
    now = time.time_ns() // 1000
    frames: list[ArchivedFrame] = []
    for i, path in enumerate(files):
        for frame in walmod.read_frames(path, last_file=i == len(files) - 1):
            frames.append(ArchivedFrame(frame.lsn, now, bytes(frame.raw)))
    return frames


def put_frames(store: ObjectStore, term: int, frames: list[ArchivedFrame]) -> str:
    """One frames object of ``frames`` under ``term``; its name."""
    name = wal_name(term, frames[0].lsn)
    assert store.put_new(name, encode_frames_object(term, frames)), f"{name} exists"
    return name


def put_history(store: ObjectStore, term: int, history: History) -> None:
    """``history/<term>.json`` (kept when it is there already)."""
    store.put_new(history_name(term), encode_history(term, history))


def upload_wal(data_dir: Path, store: ObjectStore) -> int:
    """The frames of ``data_dir``'s WAL the archive lacks, as one frames object under
    term 0 (with the history ``[[0, 1]]``); the last lsn the archive then holds."""
    put_history(store, 0, [(0, 1)])
    done = archived_last_lsn(store, 0)
    new = [f for f in wal_frames(data_dir) if f.lsn > done]
    if not new:
        return done
    assert new[0].lsn == done + 1, f"the WAL starts at {new[0].lsn}, the archive ends at {done}"
    put_frames(store, 0, new)
    return new[-1].lsn


def object_terms(store: ObjectStore) -> list[tuple[int, int]]:
    """(term, first lsn) of every frames object, in name order."""
    return [parse_wal_name(n) for n, _ in store.objects(WAL_PREFIX)]
