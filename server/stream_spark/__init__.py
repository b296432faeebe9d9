"""Spark analytics over a durable-streams data directory.

``stream_spark.source`` is a PySpark 4 Python data source (batch and
streaming) registered as ``durable-streams``; ``stream_spark.jobs`` holds the
console jobs that write Parquet; the operator (``stream_operator.analytics``) renders the objects
that run those jobs on Kubernetes. The format-reading part
(``stream_spark._reader``) imports nothing from Spark, so the planner and the
record reader are usable and testable without a JVM.
"""

from __future__ import annotations

from typing import Any

from stream_spark._format_name import FORMAT_NAME


def register(spark: Any) -> None:
    """Make ``spark.read.format("durable-streams")`` available in this session.

    Python data sources are registered per session, not discovered: every job
    and notebook calls this once after building its SparkSession.
    """
    from stream_spark.source import DurableStreamsDataSource

    spark.dataSource.register(DurableStreamsDataSource)


__all__ = ["FORMAT_NAME", "register"]
