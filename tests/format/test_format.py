"""The format package: explicit codecs, unknown fields ignored, segment files checked."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import orjson
import pytest

from stream_format.chain import BrokenChain, pieces
from stream_format.layout import CURRENT, DataFormat, FormatError, Layout
from stream_format.meta import StreamMeta
from stream_format.records import CorruptRecord, check_file_header, encode_file_header
from stream_server.engine.data_dir import prepare
from stream_server.streams.errors import Damaged
from stream_server.streams.store import AppendRequest, CreateRequest, StreamStore
from stream_spark._plan import Selection, batch_ranges, plan
from stream_spark._reader import MetaReader, read_slice

GOLDEN = Path(__file__).parent.parent / "fixtures" / "golden-v1"


def test_stream_meta_round_trips_field_by_field():
    m = StreamMeta(
        id=7,
        content_type="application/json",
        created_at=1.5,
        ttl=30,
        expires_at="2030-01-01T00:00:00Z",
        expires_at_ts=1893456000.0,
        closed=True,
        closed_by=("w", 1, 2),
        stream_seq="s9",
        fork_from="src",
        fork_offset=4,
        refcount=2,
        soft_deleted=True,
        touched_at=2.5,
        extra={"expiry_from": "request"},
    )
    raw = m.to_json()
    assert StreamMeta.from_json(raw) == m
    # The on-disk names are spelled out, not derived from attribute names.
    assert set(orjson.loads(raw)) == {
        "id", "content_type", "created_at", "ttl", "expires_at", "expires_at_ts", "closed",
        "closed_by", "stream_seq", "fork_from", "fork_offset", "refcount", "soft_deleted",
        "touched_at", "extra",
    }  # fmt: skip
    # Format 5 leaves out what equals its default; every reader takes it as that.
    plain = StreamMeta(id=8, content_type="text/plain", created_at=1.5)
    assert orjson.loads(plain.to_json()) == {
        "id": 8, "content_type": "text/plain", "created_at": 1.5
    }  # fmt: skip
    assert StreamMeta.from_json(plain.to_json()) == plain


def test_readers_ignore_fields_they_do_not_know():
    raw = orjson.dumps(
        {"id": 1, "content_type": "text/plain", "created_at": 0.0, "retention_start": 42}
    )
    m = StreamMeta.from_json(raw)
    assert (m.id, m.content_type, m.closed, m.fork_offset) == (1, "text/plain", False, 0)


def test_segment_headers_are_checked():
    check_file_header(encode_file_header(5), 5)
    with pytest.raises(CorruptRecord, match="belongs to stream id 5"):
        check_file_header(encode_file_header(5), 6)
    with pytest.raises(CorruptRecord, match="not a segment file"):
        check_file_header(b"NOTASEGM" + bytes(8), 5)
    with pytest.raises(CorruptRecord, match="shorter"):
        check_file_header(b"DS", 5)


def test_chain_stitches_and_reports_a_missing_source():
    class S:
        def __init__(self, fork_from, fork_offset):
            self.fork_from, self.fork_offset = fork_from, fork_offset

    streams = {"a": S(None, 0), "b": S("a", 10), "c": S("b", 15)}
    got = pieces(streams["c"], 0, 20, lambda s: s, streams.get)
    assert [(next(k for k, v in streams.items() if v is s), lo, hi) for s, lo, hi in got] == [
        ("a", 0, 10),
        ("b", 10, 15),
        ("c", 15, 20),
    ]
    with pytest.raises(BrokenChain):
        pieces(S("gone", 3), 0, 5, lambda s: s, streams.get)


def test_a_segment_file_with_a_foreign_header_is_never_served(tmp_path):
    data = tmp_path / "d"

    async def write() -> int:
        store = StreamStore(data)
        await store.start()
        await store.create(CreateRequest("s", "application/octet-stream", b"abc"))
        # Past the inline bound (format 5): the log moves into its own file.
        await store.append(AppendRequest("s", "application/octet-stream", b"def" * 400))
        sid = store.get("s").id
        await store.stop()
        return sid

    sid = asyncio.run(write())
    seg = Layout(data).segment_path(sid)
    raw = bytearray(seg.read_bytes())
    raw[:8] = b"NOTASEGM"
    seg.write_bytes(bytes(raw))

    async def read() -> None:
        store = StreamStore(data)
        await store.start()
        try:
            with pytest.raises(Damaged, match="not a segment file"):
                await store.read(store.get("s"), 0, 100)
        finally:
            await store.stop()

    asyncio.run(read())
    with MetaReader(data) as meta, pytest.raises(FormatError, match="not a segment file"):
        cut = meta.cut()
        for part in plan(cut, meta, batch_ranges(cut, Selection())):
            for sl in part:
                list(read_slice(data, sl))


# ------------------------------------------------------- read and write versions


def test_the_version_file_names_a_write_and_a_read_version():
    v1 = "durable-streams-py data format 1\n"  # format 1's one line: read = write = 1
    assert DataFormat.parse(v1) == DataFormat(1, 1)
    assert DataFormat(1, 1).text() == v1
    assert (CURRENT.write, CURRENT.read) == (5, 3)
    assert CURRENT.text() == "durable-streams-py data format 5\nread-version 3\n"
    assert DataFormat.parse(CURRENT.text()) == CURRENT
    # No read-version line: read = write. Unknown keys are ignored.
    assert DataFormat.parse("durable-streams-py data format 5\n") == DataFormat(5, 5)
    assert DataFormat.parse(
        "durable-streams-py data format 5\nread-version 2\nnote written by 9.9\n"
    ) == DataFormat(5, 2)
    for bad in (
        "",
        "durable-streams-py data format 1",  # no newline
        "durable-streams-py data format x\n",
        "durable-streams-py data format 01\n",
        "durable-streams-py data format 1\nread-version 2\n",  # read above write
        "durable-streams-py data format 2\nread-version\n",
        "some other program 1\n",
    ):
        with pytest.raises(ValueError):
            DataFormat.parse(bad)


@pytest.mark.parametrize(
    ("text", "reads", "writes"),
    [
        ("durable-streams-py data format 1\n", True, True),
        ("durable-streams-py data format 2\nread-version 1\n", True, True),
        ("durable-streams-py data format 3\nread-version 1\n", True, True),
        ("durable-streams-py data format 4\nread-version 2\n", True, True),
        ("durable-streams-py data format 5\nread-version 3\n", True, True),
        # Newer writers that changed only what writers see: still readable.
        ("durable-streams-py data format 7\nread-version 3\n", True, False),
        # A change readers would misread: neither.
        ("durable-streams-py data format 7\nread-version 4\n", False, False),
        ("durable-streams-py data format 99\n", False, False),
        ("not ours\n", False, False),
    ],
)
def test_readers_need_the_read_version_and_writers_the_write_version(tmp_path, text, reads, writes):
    (tmp_path / "FORMAT").write_text(text)
    layout = Layout(tmp_path)
    for write, ok in ((False, reads), (True, writes)):
        if ok:
            assert isinstance(layout.check_version(write=write), DataFormat)
        else:
            with pytest.raises(FormatError, match="not supported"):
                layout.check_version(write=write)


def test_the_spark_reader_reads_a_directory_only_a_newer_writer_may_write(tmp_path):
    data = tmp_path / "d"
    shutil.copytree(GOLDEN, data)
    (data / "FORMAT").write_text("durable-streams-py data format 9\nread-version 1\n")
    with MetaReader(data) as meta:
        cut = meta.cut()
        rows = [
            bytes(row.payload)
            for part in plan(cut, meta, batch_ranges(cut, Selection(glob="bin/a")))
            for sl in part
            for row in read_slice(data, sl)
        ]
    assert b"".join(rows) == b"hello world"
    with pytest.raises(FormatError, match="not supported for writing"):
        prepare(Layout(data))
