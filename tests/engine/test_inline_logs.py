"""Small logs kept inline in LMDB (format 5, ``engine/segments.py``): a new stream has no
segment file until a batch takes its log past ``inline_max``; that batch's frame carries
the whole log, so replay alone rebuilds the file. Real engines on real files."""

from __future__ import annotations

import lmdb

from stream_format import wal
from stream_format.meta import DB_INLINE, id_key
from stream_format.records import FILE_HEADER_SIZE, KIND_BYTES
from stream_server.engine import Engine
from stream_server.engine.ops import Append, DropLog
from stream_server.engine.replica import commit_frames, write_frames
from stream_server.engine.segments import INLINE_MAX
from testkit.engines import crash, new_stream, read_all
from testkit.replica_engines import primary_frames, standby


def inline_value(e: Engine, sid: int) -> bytes | None:
    assert e.meta is not None
    with e.meta.env.begin() as txn:
        raw = txn.get(id_key(sid), db=e.meta.dbs[DB_INLINE])
        return None if raw is None else bytes(raw)


def segment_files(e: Engine) -> list[str]:
    return sorted(p.name for p in e.layout.segments.rglob("*.log"))


def test_a_small_stream_lives_in_lmdb_and_survives_a_clean_stop_and_a_crash(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    for sid in range(1, 101):
        new_stream(e, f"s{sid}", sid)
        e.commit([Append(sid, KIND_BYTES, [b"x%03d" % sid * 25])])
    assert segment_files(e) == []  # nothing for a checkpoint to flush but LMDB
    assert 1 in e.segments.inline and len(e.segments.inline) == 100
    value = inline_value(e, 7)
    assert value is not None and value.endswith(b"x007" * 25)
    assert e.tails[7].file_len == len(value)
    assert read_all(e, 7, KIND_BYTES, 0, 100) == b"x007" * 25
    e.close()

    e = Engine(tmp_path / "d")
    e.open()
    assert len(e.segments.inline) == 100
    e.commit([Append(7, KIND_BYTES, [b"!"])])
    crash(e)
    e = Engine(tmp_path / "d")
    _, report = e.open()
    assert report.wal_frames_replayed == 1 and report.damaged == {}
    assert read_all(e, 7, KIND_BYTES, 0, 101) == b"x007" * 25 + b"!"
    assert segment_files(e) == []
    e.close()


def test_growing_past_the_bound_moves_the_log_into_its_file_in_one_whole_write(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    new_stream(e, "s", 1)
    first = b"a" * 600
    e.commit([Append(1, KIND_BYTES, [first])])
    assert segment_files(e) == []
    second = b"b" * 600
    e.commit([Append(1, KIND_BYTES, [second])])
    assert inline_value(e, 1) is None and 1 not in e.segments.inline
    whole = e.layout.segment_path(1).read_bytes()
    assert len(whole) == e.tails[1].file_len > INLINE_MAX
    # The frame of the move: the whole log as one write at position 0, the value deleted.
    (path,) = wal.wal_files(e.layout.wal)
    *_, last = wal.read_frames(path, last_file=True)
    writes = [x for x in last.entries if x[0] == wal.WRITE]
    assert [(sid, pos, bytes(data)) for _, sid, pos, data in writes] == [(1, 0, whole)]
    assert (wal.DELETE, DB_INLINE, id_key(1)) in last.entries
    crash(e)
    # A power cut that lost the new file: replaying the one frame rebuilds it.
    e.layout.segment_path(1).unlink()
    e = Engine(tmp_path / "d")
    _, report = e.open()
    assert report.damaged == {}
    assert read_all(e, 1, KIND_BYTES, 0, 1200) == first + second
    e.commit([Append(1, KIND_BYTES, [b"c"])])  # a file's log from here on
    assert inline_value(e, 1) is None
    assert read_all(e, 1, KIND_BYTES, 0, 1201) == first + second + b"c"
    e.close()


def test_dropping_an_inline_stream_deletes_its_value(tmp_path):
    e = Engine(tmp_path / "d")
    e.open()
    new_stream(e, "s", 1)
    e.commit([Append(1, KIND_BYTES, [b"short"])])
    assert inline_value(e, 1) is not None
    e.commit([DropLog(1)])
    assert inline_value(e, 1) is None and 1 not in e.segments.inline and 1 not in e.tails
    e.close()


def test_with_inline_max_0_every_log_has_its_file_as_before_format_5(tmp_path):
    e = Engine(tmp_path / "d", inline_max=0)
    e.open()
    new_stream(e, "s", 1)
    e.commit([Append(1, KIND_BYTES, [b"short"])])
    assert inline_value(e, 1) is None
    assert e.layout.segment_path(1).stat().st_size == FILE_HEADER_SIZE + 28 + 5
    e.close()


def test_a_standby_applies_inline_logs_and_the_move_from_the_primarys_frames(tmp_path):
    def batches(primary: Engine) -> None:
        new_stream(primary, "s", 1)
        primary.commit([Append(1, KIND_BYTES, [b"p" * 500])])
        primary.commit([Append(1, KIND_BYTES, [b"q" * 700])])  # the move

    frames = primary_frames(tmp_path / "primary", batches)
    e, standby_hooks = standby(tmp_path / "standby")
    written = write_frames(e, standby_hooks, frames[:2])
    assert written is not None
    commit_frames(e, written)
    assert 1 in e.segments.inline and segment_files(e) == []
    assert read_all(e, 1, KIND_BYTES, 0, 500) == b"p" * 500
    written = write_frames(e, standby_hooks, frames[2:])
    assert written is not None
    commit_frames(e, written)
    assert 1 not in e.segments.inline and inline_value(e, 1) is None
    assert read_all(e, 1, KIND_BYTES, 0, 1200) == b"p" * 500 + b"q" * 700
    e.close()


def test_an_older_servers_lmdb_without_the_inline_database_is_given_one(tmp_path):
    """Format 4 (and before) has no ``inline`` database: opening one creates it, and the
    old files stay the logs of their streams."""
    e = Engine(tmp_path / "d", inline_max=0)
    e.open()
    new_stream(e, "old", 1)
    e.commit([Append(1, KIND_BYTES, [b"kept in a file"])])
    e.close()
    env = lmdb.open(str(tmp_path / "d" / "meta"), max_dbs=10)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"inline", txn=txn), delete=True)
    env.close()
    e = Engine(tmp_path / "d")
    e.open()
    assert e.segments.inline == set()
    e.commit([Append(1, KIND_BYTES, [b"!"])])
    new_stream(e, "new", 2)
    assert segment_files(e) == ["0000000000000001.log"]
    assert read_all(e, 1, KIND_BYTES, 0, 15) == b"kept in a file!"
    assert 2 in e.segments.inline
    e.close()
