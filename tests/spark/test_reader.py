"""The format reader and planner without Spark: splitting, limits, expiry, damage."""

from __future__ import annotations

import itertools
import shutil
import time

import httpx
import pytest

from stream_format.layout import VERSION_FILE
from stream_format.offsets import format_offset
from stream_spark._plan import FORKS_STITCH, Selection, batch_ranges, cap_by_bytes, plan, select
from stream_spark._reader import FormatError, MetaReader, read_slice
from stream_spark.options import OptionError, ReadOptions
from testkit import needs

from ._corpus import OCTET, http_read, post, put

pytestmark = pytest.mark.processes


def rows_of(data_dir, parts) -> list:
    return [row for part in parts for sl in part for row in read_slice(data_dir, sl)]


def test_long_stream_splits_at_record_boundaries(corpus, corpus_server):
    data = corpus_server.data_dir
    with MetaReader(data) as meta:
        cut = meta.cut()
        ranges = {"bin/big": (0, cut.streams["bin/big"].tail)}
        whole = plan(cut, meta, ranges)
        split = plan(cut, meta, ranges, target_bytes=64 * 1024)
    assert len(whole) == 1 and len(split) > 10
    one, many = rows_of(data, whole), rows_of(data, split)
    # Same records, each whole, each once: no partition boundary cut a record.
    assert [(r.start, r.stop) for r in many] == [(r.start, r.stop) for r in one]
    assert len(one) == 90
    with httpx.Client(base_url=corpus.base) as c:
        assert b"".join(bytes(r.payload) for r in many) == http_read(c, "bin/big").data
    slices = [sl for part in split for sl in part]
    assert all(a.last == b.first for a, b in itertools.pairwise(slices))


def test_index_read_in_batches_joins_up(corpus_server, monkeypatch):
    from stream_spark import _reader

    with MetaReader(corpus_server.data_dir) as meta:
        big = meta.cut().streams["bin/big"]
        whole = list(meta.boundaries(big, 0, big.tail))
        monkeypatch.setattr(_reader, "INDEX_BATCH", 7)
        assert list(meta.boundaries(big, 0, big.tail)) == whole
        assert len(whole) > 3 * 7
        middle = whole[10][0], whole[30][0]
        assert list(meta.boundaries(big, *middle)) == whole[11:30]


def test_small_streams_share_partitions(corpus, corpus_server):
    with MetaReader(corpus_server.data_dir) as meta:
        cut = meta.cut()
        ranges = batch_ranges(cut, Selection(glob="[!b]*"))  # everything but bin/*
        parts = plan(cut, meta, ranges)
        balanced = plan(cut, meta, ranges, min_partitions=3, min_share=1024)
        floored = plan(cut, meta, ranges, min_partitions=3)  # under 4 MiB in all: one task
    assert len(parts) == 1 and len({sl.stream for sl in parts[0]}) == len(ranges)
    assert len(balanced) >= 3
    assert len(floored) == 1


def test_trigger_byte_limit_stops_at_boundaries_and_progresses(corpus_server):
    with MetaReader(corpus_server.data_dir) as meta:
        cut = meta.cut()
        big = cut.streams["bin/big"]
        end, used = cap_by_bytes(
            cut, meta, "bin/big", 0, big.tail, 100_000, FORKS_STITCH, must_progress=True
        )
        assert 0 < end < big.tail and used <= 100_000
        assert end in {u for u, _ in meta.boundaries(big, 0, big.tail)}
        # A budget below one granule: nothing, unless the trigger must progress.
        assert (
            cap_by_bytes(cut, meta, "bin/big", 0, big.tail, 10, FORKS_STITCH, must_progress=False)[
                0
            ]
            == 0
        )
        first, _ = cap_by_bytes(
            cut, meta, "bin/big", 0, big.tail, 10, FORKS_STITCH, must_progress=True
        )
        assert first == min(u for u, _ in meta.boundaries(big, 0, big.tail))
        small = cut.streams["bin/small"]  # no index entry: the whole stream or nothing
        assert (
            cap_by_bytes(
                cut, meta, "bin/small", 0, small.tail, 10, FORKS_STITCH, must_progress=True
            )[0]
            == small.tail
        )


def test_expired_and_deleted_streams_are_skipped_by_default(corpus, corpus_server):
    with MetaReader(corpus_server.data_dir) as meta:
        now, later = meta.cut(), meta.cut(now=time.time() + 2 * 3600)
    assert not now.streams["ttl/hour"].expired and later.streams["ttl/hour"].expired
    assert "ttl/hour" in [s.path for s in select(now, Selection())]
    assert "ttl/hour" not in [s.path for s in select(later, Selection())]
    assert "ttl/hour" in [s.path for s in select(later, Selection(include_expired=True))]
    assert now.streams["del/src"].soft_deleted
    assert "del/src" not in [s.path for s in select(now, Selection())]
    assert "del/src" in [s.path for s in select(now, Selection(include_deleted=True))]


def test_damage_is_an_error_never_a_short_read(server_factory, tmp_path):
    srv = server_factory().start()
    with httpx.Client(base_url=srv.base) as c:
        put(c, "d", OCTET)
        for i in range(3):  # past the inline bound: a segment file to damage
            post(c, "d", OCTET, bytes([65 + i]) * 400)
    srv.stop()

    def read_all(data_dir) -> list:
        with MetaReader(data_dir) as meta:
            cut = meta.cut()
            return rows_of(data_dir, plan(cut, meta, batch_ranges(cut, Selection())))

    assert [bytes(r.payload) for r in read_all(srv.data_dir)] == [
        b"A" * 400,
        b"B" * 400,
        b"C" * 400,
    ]
    with MetaReader(srv.data_dir) as meta:
        info = meta.cut().streams["d"]
        segment = meta.layout.segment_path(info.id)

    flipped = tmp_path / "flipped"
    shutil.copytree(srv.data_dir, flipped)
    seg = flipped / segment.relative_to(srv.data_dir)
    raw = bytearray(seg.read_bytes())
    raw[info.file_len - 50] ^= 0xFF  # inside the last payload
    seg.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="checksum"):
        read_all(flipped)

    short = tmp_path / "short"
    shutil.copytree(srv.data_dir, short)
    seg = short / segment.relative_to(srv.data_dir)
    seg.write_bytes(seg.read_bytes()[: info.file_len - 10])
    with pytest.raises(FormatError, match="committed length"):
        read_all(short)

    other = tmp_path / "other"
    shutil.copytree(srv.data_dir, other)
    (other / VERSION_FILE).write_text("durable-streams-py data format 6\nread-version 4\n")
    with pytest.raises(FormatError, match="not supported"):
        MetaReader(other)


def test_prepare_recovers_a_crashed_directory(server_factory):
    """A killed server's directory (WAL not checkpointed) reads in full after recovery."""
    from stream_server.recover import main as prepare
    from stream_server.recover import recover

    srv = server_factory().start()
    with httpx.Client(base_url=srv.base) as c:
        put(c, "k", OCTET)
        tails = [post(c, "k", OCTET, b"%d;" % i).headers["stream-next-offset"] for i in range(20)]
    srv.kill()
    assert recover(srv.data_dir).wal_frames_replayed > 0  # the crash left a WAL to replay
    assert prepare([str(srv.data_dir)]) == 0  # and the command line exits cleanly after
    with MetaReader(srv.data_dir) as meta:
        cut = meta.cut()
        rows = rows_of(srv.data_dir, plan(cut, meta, batch_ranges(cut, Selection())))
    assert format_offset(rows[-1].stop) == tails[-1]
    assert b"".join(bytes(r.payload) for r in rows) == b"".join(b"%d;" % i for i in range(20))


def test_wire_offsets_are_format_offset():
    pa = needs.module("pyarrow", install="the spark extra: make deps, or pip install -e '.[spark]'")
    from stream_spark._arrow import wire_offsets

    units = [0, 1, 9, 10, 12345678, 10**16 - 1]
    assert wire_offsets(pa.array(units, pa.int64())).to_pylist() == [
        format_offset(u) for u in units
    ]


def test_options():
    opts = ReadOptions.parse(
        {
            "path": "/d",
            "streams": "a/*",
            "startOffset": format_offset(5),
            "endOffset": "0000000000000000_0000000000000009",
            "startTime": "2026-01-01T00:00:00Z",
            "endTime": "1767225601.5",
            "partitionSizeBytes": "64m",
            "MINPARTITIONS": "4",
            "forks": "own",
        }
    )
    assert (opts.start_unit, opts.end_unit) == (5, 9)
    assert opts.time_from_us == 1767225600_000_000 and opts.time_to_us == 1767225601_500_000
    assert opts.partition_bytes == 64 * 2**20 and opts.min_partitions == 4
    assert opts.selection == Selection(glob="a/*", forks="own")
    assert ReadOptions.parse({"path": "/d", "startOffset": "-1"}).start_unit is None
    for bad in (
        {},
        {"path": "/d", "forks": "all"},
        {"path": "/d", "startOffset": "now"},
        {"path": "/d", "partitionSizeBytes": "big"},
        {"path": "/d", "includeDeleted": "yes"},
        {"path": "/d", "startTime": "yesterday"},
        {"path": "/d", "streamz": "*"},
    ):
        with pytest.raises(OptionError):
            ReadOptions.parse(bad)
