"""Batch reads with Spark (local mode) over data a real server wrote through HTTP."""

from __future__ import annotations

import itertools
import json
import struct
import threading
from collections import defaultdict

import httpx
import pytest

from stream_format.offsets import format_offset, parse_offset

from ._corpus import JSON, OCTET, http_read, put

pytestmark = pytest.mark.processes

FORMAT = "durable-streams"


def rows_by_stream(df) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for row in df.collect():
        out[row.stream].append(row)
    for rows in out.values():
        rows.sort(key=lambda r: r.unit)
    return dict(out)


def check_against_http(c: httpx.Client, stream: str, rows: list, *, per_row_gets: bool) -> None:
    """Rows are the protocol's read of ``stream``: every byte, every offset."""
    http = http_read(c, stream)
    assert all(r.content_type == http.content_type for r in rows)
    if not rows:
        assert http.tail == 0 and not http.data and not http.messages
        return
    # Offset for offset: contiguous from the start to the committed tail.
    assert rows[0].unit == 0
    for prev, nxt in itertools.pairwise(rows):
        assert prev.next_unit == nxt.unit
    assert rows[-1].next_unit == http.tail
    for r in rows:
        assert r.offset == format_offset(r.unit) and r.next_offset == format_offset(r.next_unit)
    # Byte for byte.
    if http.content_type.startswith("application/json"):
        assert [r.payload for r in rows] == http.messages
        assert all(r.next_unit == r.unit + 1 for r in rows)
        assert [r.json for r in rows] == [m.decode() for m in http.messages]
    else:
        assert b"".join(r.payload for r in rows) == http.data
        for r in rows:
            assert r.payload == http.data[r.unit : r.next_unit]
            assert r.json is None
    # A read at each row's offset starts with exactly that row.
    for r in rows if per_row_gets else rows[:: max(1, len(rows) // 5)]:
        resp = c.get(stream, params={"offset": r.offset})
        assert resp.status_code == 200
        if http.content_type.startswith("application/json"):
            assert resp.content.startswith(b"[" + r.payload)
            assert resp.content[len(r.payload) + 1 : len(r.payload) + 2] in (b",", b"]")
        else:
            assert resp.content.startswith(r.payload)
        assert parse_offset(resp.headers["stream-next-offset"]) >= r.next_unit


def test_rows_are_the_protocol_read(spark, corpus, corpus_server):
    df = spark.read.format(FORMAT).load(str(corpus_server.data_dir))
    by_stream = rows_by_stream(df)
    # Soft-deleted and empty streams: the first is skipped, the second has no rows.
    assert sorted(by_stream) == sorted(set(corpus.readable) - {"closed/empty"})
    with httpx.Client(base_url=corpus.base, timeout=30) as c:
        for stream in corpus.readable:
            check_against_http(
                c, stream, by_stream.get(stream, []), per_row_gets=stream != "bin/big"
            )
        assert http_read(c, "closed/one").closed

    # Forks: inherited rows come from the source's log, cut exactly at the fork offset.
    sub = by_stream["fork/sub"]
    assert [(r.unit, r.next_unit, r.origin) for r in sub[-4:]] == [
        (27, 38, "bin/small"),
        (38, 43, "bin/small"),  # the first 5 bytes of a 12-byte record
        (43, 47, "fork/sub"),
        (47, 58, "fork/sub"),
    ]
    deeper = by_stream["fork/sub/deeper"]
    assert [(r.unit, r.next_unit, r.origin) for r in deeper[-2:]] == [
        (38, 40, "bin/small"),
        (40, 44, "fork/sub/deeper"),
    ]
    assert {r.origin for r in by_stream["del/fork"]} == {"del/src", "del/fork"}

    # Idempotent producers: the tuple of every record, and the retry stored once.
    tuples = [
        (r.producer_id, r.producer_epoch, r.producer_seq, r.payload) for r in by_stream["prod/p"]
    ]
    assert tuples == [
        ("alpha", 0, 0, b"alpha/0/0;"),
        ("alpha", 0, 1, b"alpha/0/1;"),
        ("alpha", 0, 2, b"alpha/0/2;"),
        ("beta", 3, 0, b"beta/3/0;"),
        ("beta", 3, 1, b"beta/3/1;"),
        ("alpha", 1, 0, b"alpha/1/0;"),
        (None, None, None, b"no-producer;"),
    ]
    events = by_stream["json/events"]
    assert [json.loads(r.json) for r in events[:2]] == [
        {"n": 0},
        {"n": 1, "s": "\u00fcn\u00efcode"},
    ]
    assert [r.producer_id for r in events[-4:]] == ["jp"] * 4


def test_options(spark, corpus, corpus_server):
    data = str(corpus_server.data_dir)

    def read(**options):
        reader = spark.read.format(FORMAT)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(data)

    assert sorted({r.stream for r in read(streams="fork/*").select("stream").collect()}) == [
        "fork/at",
        "fork/json",
        "fork/sub",
        "fork/sub/deeper",
    ]
    assert read(streams="no/such/*").count() == 0

    # A soft-deleted stream on request; its rows are what its fork inherited.
    deleted = rows_by_stream(read(streams="del/*", includeDeleted="true"))
    assert b"".join(r.payload for r in deleted["del/src"]) == b"inherited by the fork "

    # forks=own: each record once, where it was appended.
    own = rows_by_stream(read(streams="fork/sub*", forks="own"))
    assert [(r.unit, r.payload) for r in own["fork/sub"]] == [(43, b"SUB1"), (47, b"SUB2-longer")]
    assert [(r.unit, r.payload) for r in own["fork/sub/deeper"]] == [(40, b"DEEP")]

    # Offset range: the protocol's read from startOffset, stopped at endOffset.
    with httpx.Client(base_url=corpus.base) as c:
        expected = http_read(c, "bin/small", start=20).data[: 45 - 20]
    ranged = rows_by_stream(
        read(streams="bin/small", startOffset=format_offset(20), endOffset=format_offset(45))
    )["bin/small"]
    assert [(r.unit, r.next_unit) for r in ranged] == [(20, 27), (27, 38), (38, 45)]
    assert b"".join(r.payload for r in ranged) == expected

    # Time range: records committed at or after a given record's time.
    log = rows_by_stream(read(streams="text/log"))["text/log"]
    since = log[7].timestamp.astimezone().isoformat()  # naive local time -> ISO 8601 with zone
    later = rows_by_stream(read(streams="text/log", startTime=since))["text/log"]
    assert [r.unit for r in later] == [r.unit for r in log if r.timestamp >= log[7].timestamp]
    assert later[0].unit == log[7].unit

    # Small partitions: a long stream split at record boundaries, same rows.
    small = read(partitionSizeBytes="64k")
    assert small.rdd.getNumPartitions() > 10
    key = ["stream", "unit"]
    assert small.orderBy(*key).collect() == read().orderBy(*key).collect()
    # minPartitions does not cut a small read (about 1 MB) into tiny tasks.
    assert read(streams="bin/big", minPartitions="3").rdd.getNumPartitions() == 1
    # A stream shorter than one index granule has no boundary to split at.
    assert read(streams="bin/small", minPartitions="3").rdd.getNumPartitions() == 1

    with pytest.raises(Exception, match="unknown option"):
        read(sreams="x").count()
    with pytest.raises(Exception, match=r"not supported by this reader|no FORMAT"):
        spark.read.format(FORMAT).load(str(corpus_server.data_dir / "meta")).count()


BLOCK = struct.Struct("<II")  # sequence number, body length


def block(seq: int) -> bytes:
    """A self-checking append: a torn or merged record cannot pass ``parse_blocks``."""
    body = bytes([seq % 251]) * (64 + (seq * 7919) % 3000)
    return BLOCK.pack(seq, len(body)) + body


def test_consistent_cut_while_appending(spark, server_factory):
    """Reads while a server keeps appending: whole records, up to committed tails, one instant.

    One writer appends block after block, round-robin over the streams, each
    append acknowledged before the next is sent. At any instant the committed
    data is therefore a prefix of that sequence: stream j holds the blocks
    j, j+k, j+2k, ... below some global count. A read of one consistent cut
    satisfies this across all streams; tails read at different moments would not.
    """
    srv = server_factory().start()
    names = ["live/a", "live/b", "live/c", "live/j"]
    acked: dict[str, set[int]] = {n: {0} for n in names}
    stop = threading.Event()
    running = threading.Event()  # set once appends are under way: reads overlap them
    errors: list[BaseException] = []
    count = [0]

    def append_forever() -> None:
        try:
            with httpx.Client(base_url=srv.base, timeout=30) as c:
                for n in names:
                    put(c, n, JSON if n.endswith("j") else OCTET)
                seq = 0
                while not stop.is_set() or seq < 3 * len(names):
                    name = names[seq % len(names)]
                    if name.endswith("j"):
                        body = json.dumps({"seq": seq, "pad": "x" * (seq % 50)}).encode()
                        r = c.post(name, headers=JSON, content=body)
                    else:
                        r = c.post(name, headers=OCTET, content=block(seq))
                    assert r.status_code == 204, r.text
                    acked[name].add(parse_offset(r.headers["stream-next-offset"]))
                    seq += 1
                    count[0] = seq
                    if seq == 2 * len(names):
                        running.set()
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=append_forever)
    writer.start()
    try:
        assert running.wait(60), errors
        reads = []
        for _ in range(3):
            df = spark.read.format(FORMAT).option("streams", "live/*").load(str(srv.data_dir))
            reads.append(rows_by_stream(df))
    finally:
        stop.set()
        writer.join()
    assert not errors, errors
    assert count[0] > 0
    with httpx.Client(base_url=srv.base) as c:
        final = {n: http_read(c, n) for n in names}
    k = len(names)
    for by_stream in reads:
        seqs: dict[str, list[int]] = {}
        for j, name in enumerate(names):
            rows = by_stream.get(name, [])
            end = rows[-1].next_unit if rows else 0
            # Nothing past a committed tail: the read ends where an append was acknowledged.
            assert end in acked[name]
            assert end <= final[name].tail
            if name.endswith("j"):
                got = [json.loads(r.json)["seq"] for r in rows]
                assert [r.payload for r in rows] == final[name].messages[: len(rows)]
            else:
                got = [parse_block(r.payload) for r in rows]
                assert b"".join(r.payload for r in rows) == final[name].data[:end]
            assert got == list(range(j, j + k * len(got), k))
            seqs[name] = got
        total = sum(len(s) for s in seqs.values())
        assert total >= 2 * k  # the read began after the first appends
        # The global prefix: stream j holds exactly the blocks below ``total`` for it.
        for j, name in enumerate(names):
            assert len(seqs[name]) == len(range(j, total, k)), (name, total, seqs)


def parse_block(payload: bytes) -> int:
    seq, size = BLOCK.unpack_from(payload)
    assert len(payload) == BLOCK.size + size, "a torn or merged record"
    assert payload[BLOCK.size :] == bytes([seq % 251]) * size
    return seq
