"""The SparkSession a job runs in, and the options every job shares.

Under ``spark-submit`` (and so under the Spark Operator) the master and the
Python executable come from the submission; run from a console, a job starts
``local[*]`` with workers on this very interpreter, so that the workers can
import ``stream_spark`` and its dependencies.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from stream_spark import FORMAT_NAME, register


def under_spark_submit() -> bool:
    """spark-submit launches Python with a gateway to its JVM already running."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None) -> Any:
    """A SparkSession with the source registered; without PySpark (or PyArrow), a line
    saying what to install and exit status 2, not an import traceback."""
    try:
        # The source's batches need PyArrow: checked here too, to say so once.
        import pyarrow  # type: ignore[import-untyped]  # noqa: F401
        from pyspark.sql import SparkSession
    except ModuleNotFoundError as exc:
        missing = (exc.name or "pyspark").split(".")[0]
        print(
            f"{app_name}: {missing} is not installed; the Spark jobs need the 'spark' extra: "
            "pip install 'durable-streams-py[spark]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None

    builder = SparkSession.builder.appName(app_name)
    if master is None and not under_spark_submit():
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            builder = builder.config("spark.ui.showConsoleProgress", "false")
    # Hour buckets and time options mean UTC unless the job is told otherwise.
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data_dir", help="the stream server's data directory (read only)")
    parser.add_argument("--out", required=True, help="output directory (Parquet)")
    parser.add_argument("--streams", default="*", help="stream path glob (default: every stream)")
    parser.add_argument(
        "--include-deleted",
        action="store_true",
        help="also read soft-deleted streams (still read by their forks)",
    )
    parser.add_argument(
        "--partition-size", default=None, help="target bytes per partition, e.g. 128m"
    )
    parser.add_argument("--start-time", default=None, help="ISO 8601 or Unix seconds (inclusive)")
    parser.add_argument("--end-time", default=None, help="ISO 8601 or Unix seconds (exclusive)")
    parser.add_argument(
        "--mode",
        default="overwrite",
        choices=["overwrite", "append", "error", "ignore"],
        help="what to do when the output exists (default: overwrite)",
    )
    parser.add_argument(
        "--master", default=None, help="Spark master (default: local[*], or spark-submit's)"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )


def conf_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--conf needs KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def read(spark: Any, args: argparse.Namespace, **extra: str) -> Any:
    """The source over ``args.data_dir`` with the shared options applied.

    At least one partition per core: the source cannot see the cluster's size,
    and a small read packed into one partition would leave the other cores idle.
    """
    reader = (
        spark.read.format(FORMAT_NAME)
        .option("streams", args.streams)
        .option("minPartitions", str(spark.sparkContext.defaultParallelism))
    )
    if args.include_deleted:
        reader = reader.option("includeDeleted", "true")
    if args.partition_size:
        reader = reader.option("partitionSizeBytes", args.partition_size)
    if args.start_time:
        reader = reader.option("startTime", args.start_time)
    if args.end_time:
        reader = reader.option("endTime", args.end_time)
    for key, value in extra.items():
        reader = reader.option(key, value)
    return reader.load(args.data_dir)
