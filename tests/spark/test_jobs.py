"""The console jobs, run in-process on the shared session, against the corpus."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import httpx
import pytest

from stream_spark._plan import FORKS_OWN, Selection, batch_ranges, plan
from stream_spark._reader import MetaReader, read_slice
from stream_spark.jobs import extract, stats

from ._corpus import http_read

pytestmark = pytest.mark.processes

HOUR_US = 3_600_000_000


def own_records(data_dir) -> dict[str, list]:
    """Each stream's own records, read with the format reader alone (no Spark)."""
    out: dict[str, list] = defaultdict(list)
    with MetaReader(data_dir) as meta:
        cut = meta.cut()
        sel = Selection(forks=FORKS_OWN)
        for part in plan(cut, meta, batch_ranges(cut, sel), forks=FORKS_OWN):
            for sl in part:
                out[sl.stream].extend(read_slice(data_dir, sl))
    return dict(out)


def epoch_us(dt: datetime) -> int:
    """PySpark returns timestamps as naive local datetimes."""
    return round(dt.timestamp() * 1_000_000)


def test_stream_stats(spark, corpus, corpus_server, tmp_path):
    out = tmp_path / "stats"
    assert stats.main([str(corpus_server.data_dir), "--out", str(out)]) == 0
    by_stream = {r.stream: r for r in spark.read.parquet(str(out / "by_stream")).collect()}
    by_hour = spark.read.parquet(str(out / "by_hour")).collect()
    expected = own_records(corpus_server.data_dir)
    assert sorted(by_stream) == sorted(expected)
    for stream, records in expected.items():
        got = by_stream[stream]
        times = [r.timestamp_us for r in records]
        assert got.records == len(records)
        assert got.bytes == sum(len(r.payload) for r in records)
        assert got.producers == len({r.producer.id for r in records if r.producer})
        assert (epoch_us(got.first_time), epoch_us(got.last_time)) == (min(times), max(times))
        span = (max(times) - min(times)) / 1e6
        if span > 0:
            assert abs(got.append_rate - (len(records) - 1) / span) < 1e-6 * got.append_rate
        else:
            assert got.append_rate is None
    for stream, pids in corpus.producers.items():
        assert by_stream[stream].producers == len(pids)
    # Streams that are not forks: their bytes are what the protocol returns.
    with httpx.Client(base_url=corpus.base) as c:
        for stream in ("bin/big", "text/log", "prod/p"):
            assert by_stream[stream].bytes == len(http_read(c, stream).data)
        assert by_stream["json/orders"].records == len(corpus.orders)

    hourly: dict[tuple, list] = defaultdict(list)
    for stream, records in expected.items():
        for r in records:
            hourly[(stream, r.timestamp_us - r.timestamp_us % HOUR_US)].append(r)
    assert sorted((r.stream, epoch_us(r.hour)) for r in by_hour) == sorted(hourly)
    for r in by_hour:
        records = hourly[(r.stream, epoch_us(r.hour))]
        assert r.records == len(records)
        assert r.bytes == sum(len(x.payload) for x in records)
        assert abs(r.append_rate - len(records) / 3600) < 1e-12


def test_extract(spark, corpus, corpus_server, tmp_path):
    out = tmp_path / "orders"
    argv = [
        str(corpus_server.data_dir),
        "--out",
        str(out),
        "--streams",
        "json/orders",
        "--field",
        "user=$.user.id:bigint",
        "--field",
        "amount=$.amount:double",
        "--field",
        "sku=$.sku",
    ]
    assert extract.main(argv) == 0
    rows = spark.read.parquet(str(out)).orderBy("offset").collect()
    assert [(r.user, r.amount, r.sku) for r in rows] == [
        (o["user"]["id"], o["amount"], o.get("sku")) for o in corpus.orders
    ]
    assert {r.stream for r in rows} == {"json/orders"}
    assert rows[0].offset == "0000000000000000_0000000000000000"

    # Every stream: only JSON ones contribute, partitioned by stream.
    out_all = tmp_path / "all"
    argv = [str(corpus_server.data_dir), "--out", str(out_all), "--field", "n=$.n:int"]
    assert extract.main([*argv, "--partition-by", "stream"]) == 0
    table = spark.read.parquet(str(out_all))
    assert {r.stream for r in table.select("stream").distinct().collect()} == set(
        corpus.json_streams
    )
    events = table.where("stream = 'json/events'").orderBy("offset").collect()
    assert [r.n for r in events[:3]] == [0, 1, 2]
