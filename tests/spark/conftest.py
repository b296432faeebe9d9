"""One SparkSession for the whole test session, and one corpus written by a real server.

Spark in local mode costs 10 to 15 s to start and several seconds for its
first query, so every Spark test shares this session and this corpus; tests
that need their own data use their own stream paths on the corpus server or
a server of their own from ``server_factory``.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from testkit import needs

from ._corpus import Corpus, write_corpus

NO_SPARK = importlib.util.find_spec("pyspark") is None


@pytest.fixture(scope="session")
def spark():
    if NO_SPARK:
        needs.missing(
            "pyspark is not installed: the spark extra (make deps, or pip install -e '.[spark]')"
        )
    if needs.absent("java") and not os.environ.get("JAVA_HOME"):
        needs.missing("java not installed: Debian's openjdk-17-jre-headless (make system-deps)")
    # Python workers are separate processes: run them on this interpreter, where
    # stream_spark and its dependencies are installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import stream_spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("stream-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    stream_spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def corpus_server(tmp_path_factory):
    """A real server process that stays up for the session (HTTP reads to compare with)."""
    from testkit.server_process import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("spark-corpus") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def corpus(corpus_server) -> Corpus:
    return write_corpus(corpus_server.base)
