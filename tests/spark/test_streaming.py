"""Streaming reads: per-stream tails as offsets, exactly once across restarts."""

from __future__ import annotations

import itertools
import json
import shutil
from collections import defaultdict

import httpx
import pytest

from stream_format.offsets import format_offset

from ._corpus import JSON, OCTET, http_read, post, put

pytestmark = pytest.mark.processes

FORMAT = "durable-streams"


class Sink:
    """A foreachBatch sink that remembers every delivery of every batch id."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[int, list[tuple]]] = []

    def __call__(self, df, batch_id: int) -> None:
        rows = [(r.stream, r.unit, r.next_unit, bytes(r.payload)) for r in df.collect()]
        self.deliveries.append((batch_id, sorted(rows)))

    def batches(self) -> dict[int, list[tuple]]:
        """The last delivery of each batch id: what an idempotent sink keeps."""
        return dict(self.deliveries)

    def rows(self) -> list[tuple]:
        return [row for _, rows in sorted(self.batches().items()) for row in rows]


def assert_exactly_once(rows: list[tuple], client: httpx.Client, streams: list[str]) -> None:
    """Every unit of every stream delivered once, with the protocol's bytes."""
    by_stream: dict[str, list[tuple]] = defaultdict(list)
    for row in rows:
        by_stream[row[0]].append(row)
    assert sorted(by_stream) == sorted(streams)
    for stream, got in by_stream.items():
        units = [(r[1], r[2]) for r in got]
        assert len(set(units)) == len(units), f"{stream}: a row delivered twice"
        got.sort(key=lambda r: r[1])
        http = http_read(client, stream)
        assert got[0][1] == 0 and got[-1][2] == http.tail
        assert all(a[2] == b[1] for a, b in itertools.pairwise(got)), "a gap"
        if http.content_type.startswith("application/json"):
            assert [r[3] for r in got] == http.messages
        else:
            assert b"".join(r[3] for r in got) == http.data


def run_available_now(spark, data_dir: str, checkpoint: str, sink: Sink, **options: str) -> None:
    reader = spark.readStream.format(FORMAT)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(data_dir)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None


def test_available_now_exactly_once_across_restarts(spark, server_factory, tmp_path):
    srv = server_factory().start()
    data, ckpt = str(srv.data_dir), str(tmp_path / "checkpoint")
    sink = Sink()
    with httpx.Client(base_url=srv.base, timeout=30) as c:
        put(c, "s/bin", OCTET)
        for i in range(8):
            post(c, "s/bin", OCTET, bytes([i]) * 8_000)
        put(c, "s/json", JSON)
        post(c, "s/json", JSON, json.dumps([{"i": i} for i in range(5)]).encode())

        # Run 1, in several triggers: maxBytesPerTrigger stops at record boundaries.
        run_available_now(spark, data, ckpt, sink, maxBytesPerTrigger="24k")
        first = sink.batches()
        assert len(first) >= 3
        assert_exactly_once(sink.rows(), c, ["s/bin", "s/json"])

        # A crash after the last batch ran but before Spark committed it: the
        # restart re-plans that batch from its journaled offsets and must read
        # exactly the same rows.
        last = max(first)
        commits = tmp_path / "checkpoint" / "commits"
        (commits / str(last)).unlink()
        (commits / f".{last}.crc").unlink(missing_ok=True)

        # Between runs: appends, a new stream, a fork of an existing one.
        for i in range(3):
            post(c, "s/bin", OCTET, b"after-%d" % i)
        post(c, "s/json", JSON, b'{"i": 5}')
        put(c, "s/new", OCTET, b"a stream that appeared later")
        put(
            c,
            "s/fork",
            {"Stream-Forked-From": "s/bin", "Stream-Fork-Offset": format_offset(20_000)},
        )
        post(c, "s/fork", OCTET, b"fork's own")

        deliveries = len(sink.deliveries)
        run_available_now(spark, data, ckpt, sink, maxBytesPerTrigger="24k")
        replayed = sink.deliveries[deliveries]
        assert replayed == (last, first[last])
        assert max(sink.batches()) > last
        streams = ["s/bin", "s/fork", "s/json", "s/new"]
        assert_exactly_once(sink.rows(), c, streams)

        # Nothing new: a run that delivers nothing.
        deliveries = len(sink.deliveries)
        run_available_now(spark, data, ckpt, sink)
        assert all(not rows for _, rows in sink.deliveries[deliveries:])
        assert_exactly_once(sink.rows(), c, streams)


def test_processing_time_trigger(spark, server_factory, tmp_path):
    srv = server_factory().start()
    sink = Sink()
    with httpx.Client(base_url=srv.base, timeout=30) as c:
        put(c, "p/one", OCTET, b"hello")
        query = (
            spark.readStream.format(FORMAT)
            .load(str(srv.data_dir))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            query.processAllAvailable()
            assert_exactly_once(sink.rows(), c, ["p/one"])
            post(c, "p/one", OCTET, b", world")
            put(c, "p/two", JSON, b'[{"a": 1}, {"b": 2}]')
            query.processAllAvailable()
            assert_exactly_once(sink.rows(), c, ["p/one", "p/two"])
        finally:
            query.stop()
        assert query.exception() is None
    shutil.rmtree(tmp_path / "checkpoint")
