"""Read throughput of the Spark data source: N MB in M streams, written by a real server.

    python e2e/bench/spark_read.py --total-mb 200 --streams 50 --master 'local[2]'

Starts a server from this checkout on a temporary data directory (or reads
``--data-dir`` as it is), fills it through HTTP, then times full reads with
Spark's ``noop`` sink (every column of every row crosses into the JVM;
nothing is written). Prints one line per run and the best and median
figures. Needs the server, spark and dev extras (``make deps``); it lives
here, not in the installed stream_spark package, because it starts a
server and uses the tests' process helper (testkit.servers).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import testkit (and not this folder's modules)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import os
import random
import shutil
import statistics
import tempfile
import threading
import time

import httpx

from testkit.servers import Child, free_port, http_status, stream_server_command


def fill(
    data_dir: Path, streams: int, total_bytes: int, record_bytes: int, *, json: bool = False
) -> None:
    """Write ``total_bytes`` in records of ``record_bytes`` over ``streams`` streams, via HTTP.

    Binary streams get one record per append; JSON streams get arrays of 100
    messages per append (one record per message), to measure many small records.
    """
    port = free_port()
    server = Child(
        "server",
        stream_server_command(port, data_dir),
        data_dir.parent / "bench-server.log",
        orphan_safe=True,
    )
    base = f"http://127.0.0.1:{port}/v1/stream/"
    try:
        server.start(lambda: http_status(port, "/readyz") == 200, timeout=60)
        headers = {"Content-Type": "application/json" if json else "application/octet-stream"}
        per_stream = total_bytes // streams
        payload = random.Random(0).randbytes(record_bytes)
        if json:  # 100 messages of record_bytes each: {"pad":"xxx..."}
            message = b'{"pad":"' + b"x" * max(record_bytes - 10, 0) + b'"}'
            payload = b"[" + b",".join([message] * 100) + b"]"

        def writer(indexes: list[int]) -> None:
            with httpx.Client(base_url=base, timeout=60) as c:
                for i in indexes:
                    name = f"bench/s{i:03d}"
                    c.put(name, headers=headers).raise_for_status()
                    written = 0
                    while written < per_stream:
                        chunk = payload if json else payload[: per_stream - written]
                        c.post(name, headers=headers, content=chunk).raise_for_status()
                        written += len(chunk)

        threads = [
            threading.Thread(target=writer, args=(list(range(t, streams, 8)),)) for t in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.stop(timeout=60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--total-mb", type=int, default=200)
    p.add_argument("--streams", type=int, default=50)
    p.add_argument("--record-bytes", type=int, default=4096)
    p.add_argument("--json", action="store_true", help="JSON streams, 100 messages per append")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--partition-size", default=None, help="partitionSizeBytes option")
    p.add_argument("--data-dir", type=Path, default=None, help="read this directory as it is")
    args = p.parse_args(argv)

    tmp = None
    if args.data_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="ds-spark-bench-"))
        data_dir = tmp / "data"
        t0 = time.perf_counter()
        fill(data_dir, args.streams, args.total_mb * 1_000_000, args.record_bytes, json=args.json)
        print(f"filled {args.total_mb} MB in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    else:
        data_dir = args.data_dir
    try:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        from stream_spark import FORMAT_NAME, register

        spark = (
            SparkSession.builder.master(args.master)
            .appName("durable-streams-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        # As the jobs do: at least one partition per core, so that a read of
        # less than cores x partitionSizeBytes still uses every core.
        reader = spark.read.format(FORMAT_NAME).option(
            "minPartitions", str(spark.sparkContext.defaultParallelism)
        )
        if args.partition_size:
            reader = reader.option("partitionSizeBytes", args.partition_size)
        df = reader.load(str(data_dir))
        stats = df.agg(F.count("*").alias("rows"), F.sum(F.length("payload")).alias("bytes"))
        row = stats.collect()[0]  # also warms up the Python workers
        parts = df.rdd.getNumPartitions()
        print(f"{row.rows} records, {row.bytes / 1e6:.1f} MB, {parts} partitions", file=sys.stderr)
        rates = []
        for i in range(args.runs):
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            elapsed = time.perf_counter() - t0
            rates.append(row.bytes / 1e6 / elapsed)
            print(f"run {i + 1}: {elapsed:.2f}s, {rates[-1]:.1f} MB/s", file=sys.stderr)
        print(
            f"read throughput ({args.master}, {args.streams} streams, {row.bytes / 1e6:.0f} MB, "
            f"{row.rows} records of {row.bytes / max(row.rows, 1):.0f} bytes): "
            f"best {max(rates):.1f} MB/s, median {statistics.median(rates):.1f} MB/s, "
            f"{row.rows / row.bytes * 1e6 * statistics.median(rates) / 1e3:.0f}k records/s"
        )
        spark.stop()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
