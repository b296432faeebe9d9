"""Console jobs over a data directory that write Parquet.

Each job module runs three ways: as a console command (``durable-streams-stats``,
``durable-streams-extract``) on a laptop in ``local[*]``, as the main file of
``spark-submit`` (``spark-submit .../stream_spark/jobs/stats.py ...``), and as
the ``mainApplicationFile`` of a SparkApplication.
"""
