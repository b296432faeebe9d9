"""The log reader alone (``engine/log_reads.py``), as a worker builds it: over a data
directory an engine wrote and closed, LMDB opened for reading only, and tails given
to it rather than published. Reads up to those tails, a record that fails its
checksum is damage, and a drop that overtook a reader with older tails is not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stream_format.layout import Layout
from stream_format.meta import StreamMeta
from stream_format.records import FILE_HEADER_SIZE, KIND_BYTES, KIND_JSON
from stream_server.engine.batch import Tail
from stream_server.engine.log_reads import LogReads
from stream_server.engine.metadata import Metadata
from stream_server.engine.ops import DropHead, PutKeyedValue
from stream_server.engine.segments import Segments
from stream_server.engine.storage_errors import DamagedStream, HeadDropped
from testkit.engines import file_and_inline

RECORD = 10_000  # bytes per record: a few file system blocks each


def written(root: Path, *, drop: bool = False) -> dict[int, Tail]:
    """Stream 1 (bytes, in a file): four records; with ``drop`` its head dropped to the
    third (the bytes below it punched). Stream 2 (JSON, inline). Returns the tails as
    they were before any drop."""
    e = file_and_inline(root, RECORD, [b'{"n":1}', b'{"n":2}'])
    e.commit([PutKeyedValue("space", "k", b"v")])
    before = {sid: dataclasses.replace(t) for sid, t in e.tails.items()}
    if drop:
        unit, pos = e.retention_point(1, min_pos=2 * RECORD, cutoff_us=None, max_unit=4 * RECORD)
        e.commit([DropHead(1, unit, pos)])
    e.close()
    return before


def reader(root: Path, tails: dict[int, Tail], **kw: bool) -> LogReads:
    segments = Segments(Layout(root))
    segments.meta = Metadata.read_only(Layout(root).meta)
    segments.inline = {2}
    return LogReads(segments, dict(tails), **kw)


def read_all(reads: LogReads, sid: int, kind: int, start: int, stop: int) -> bytes:
    got, cur, _ = reads.read(sid, kind, start, stop, 1 << 30)
    assert cur == stop
    return b"".join(got)


def test_reads_the_records_and_lmdb_up_to_the_tails_it_is_given(tmp_path):
    tails = written(tmp_path)
    reads = reader(tmp_path, tails)
    assert read_all(reads, 1, KIND_BYTES, RECORD - 2, RECORD + 2) == b"aabb"
    assert read_all(reads, 2, KIND_JSON, 0, 2) == b'{"n":1}{"n":2}'  # inline, from LMDB
    assert reads.record_end(1, RECORD + 5) == 2 * RECORD
    assert reads.keyed_values("space") == {"k": b"v"}
    stored = reads.stored_stream("j")
    assert stored is not None and isinstance(stored[0], StreamMeta) and stored[0].id == 2
    assert list(reads.stored_paths()) == ["a", "j"] and reads.stored_stream_count() == 2


def test_a_hint_continues_a_read_where_the_last_one_stopped(tmp_path):
    reads = reader(tmp_path, written(tmp_path))
    got, cur, hint = reads.read(1, KIND_BYTES, 0, 4 * RECORD, RECORD + 3)
    assert cur == RECORD + 3 and hint[1] > FILE_HEADER_SIZE
    rest, cur, _ = reads.read(1, KIND_BYTES, cur, 4 * RECORD, 1 << 30, hint)
    assert b"".join(got + rest) == b"".join(bytes([c]) * RECORD for c in b"abcd")


def test_no_lmdb_yet_counts_no_streams(tmp_path):
    assert LogReads(Segments(Layout(tmp_path))).stored_stream_count() == 0


def test_a_record_that_fails_its_checksum_is_damage_until_forgotten(tmp_path):
    tails = written(tmp_path)
    path = Layout(tmp_path).segment_path(1)
    good = path.read_bytes()
    path.write_bytes(good[:100] + b"X" + good[101:])  # a flipped byte in the first record
    reads = reader(tmp_path, tails)
    with pytest.raises(DamagedStream, match="bad record"):
        reads.read(1, KIND_BYTES, 0, 10, 1 << 20)
    path.write_bytes(good)
    with pytest.raises(DamagedStream):  # remembered: not read again
        reads.read(1, KIND_BYTES, 0, 10, 1 << 20)
    reads.forget_damage()
    assert read_all(reads, 1, KIND_BYTES, 0, 10) == b"a" * 10


@pytest.mark.parametrize("starts_in_lmdb", [False, True])
def test_a_drop_that_overtook_older_tails_is_head_dropped_when_lmdb_is_asked(
    tmp_path, starts_in_lmdb
):
    """The tails are from before the drop (what the writer told a worker); the bytes
    below the new start are punched. Only a reader that asks LMDB for the start as it
    is now can tell a drop from damage."""
    tails = written(tmp_path, drop=True)
    reads = reader(tmp_path, tails, starts_in_lmdb=starts_in_lmdb)
    if starts_in_lmdb:
        with pytest.raises(HeadDropped) as dropped:
            reads.read(1, KIND_BYTES, 0, 10, 1 << 20)
        assert dropped.value.start == 2 * RECORD
        assert 1 not in reads.damaged
    else:
        with pytest.raises(DamagedStream):
            reads.read(1, KIND_BYTES, 0, 10, 1 << 20)
