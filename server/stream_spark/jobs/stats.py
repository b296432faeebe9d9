"""stream-stats: per stream and per hour, how much was appended, by whom, and how fast.

Writes two Parquet tables under ``--out``:

``by_hour``   stream, hour (UTC), records, bytes, producers, first_time,
              last_time, append_rate (records per second over the hour)
``by_stream`` stream, records, bytes, producers, first_time, last_time,
              append_rate ((records - 1) / seconds from the first to the last
              record: the arrival rate; null when they share one instant),
              tail_offset

A record is one stored append unit: one append of a binary or text stream,
one message of a JSON stream. Forks count their own records only by default
(``--forks own``): inherited records were appended to the source and are
counted there; ``--forks stitch`` counts streams as the protocol reads them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stream_spark.jobs._session import add_common, conf_pairs, read, session


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="durable-streams-stats", description=__doc__.split("\n")[0])
    add_common(p)
    p.add_argument(
        "--forks",
        default="own",
        choices=["own", "stitch"],
        help="own: count each record once, where it was appended (default); "
        "stitch: count forks as the protocol reads them",
    )
    return p


def compute(df: Any) -> tuple[Any, Any]:
    """(by_hour, by_stream) DataFrames from the source's rows."""
    from pyspark.sql import functions as F

    rows = df.select(
        "stream",
        "timestamp",
        "producer_id",
        "next_offset",
        F.length("payload").cast("long").alias("size"),
    )
    measures = [
        F.count(F.lit(1)).alias("records"),
        F.sum("size").alias("bytes"),
        F.countDistinct("producer_id").alias("producers"),
        F.min("timestamp").alias("first_time"),
        F.max("timestamp").alias("last_time"),
    ]
    by_hour = (
        rows.groupBy("stream", F.date_trunc("hour", "timestamp").alias("hour"))
        .agg(*measures)
        .withColumn("append_rate", F.col("records") / F.lit(3600.0))
        .orderBy("stream", "hour")
    )
    span = F.unix_micros("last_time") - F.unix_micros("first_time")
    by_stream = (
        rows.groupBy("stream")
        .agg(*measures, F.max("next_offset").alias("tail_offset"))
        .withColumn(
            "append_rate",
            F.when(span > 0, (F.col("records") - 1) / (span / F.lit(1_000_000.0))),
        )
        .orderBy("stream")
    )
    return by_hour, by_stream


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    spark = session("durable-streams-stats", args.master, conf_pairs(args.conf))
    df = read(spark, args, forks=args.forks)
    by_hour, by_stream = compute(df)
    out = args.out.rstrip("/")
    by_hour.write.mode(args.mode).parquet(f"{out}/by_hour")
    by_stream.write.mode(args.mode).parquet(f"{out}/by_stream")
    print(f"stream-stats: wrote {out}/by_hour and {out}/by_stream", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
