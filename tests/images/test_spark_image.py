"""The Spark image runs the stats job on a volume that the server image wrote.

The job runs as the Spark Operator's driver pod starts it (the image's
entrypoint in ``driver`` mode, spark-submit, the job file from the image),
in local mode, on the data volume mounted read-only. Its Parquet output is
checked on the host against what was written over HTTP.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from stream_operator.api.spec import with_defaults
from testkit import needs
from testkit.containers import PODMAN_NEEDED
from testkit.images import SERVER_UID, SPARK_UID, report

pytestmark = [pytest.mark.processes, PODMAN_NEEDED, pytest.mark.timeout(1800)]

GRACE = with_defaults({}).lifecycle.termination_grace_period_seconds
JOB_FILE = "/opt/stream_spark/jobs/stats.py"  # what the operator's SparkApplications name
JVM_SHORT_JOB = "-XX:TieredStopAtLevel=1"  # the driver JVM's options for a short local run


def write_streams(base: str) -> dict[str, dict[str, int]]:
    """A text stream, a JSON stream and a stream two idempotent producers wrote;
    per stream the records, bytes (not for JSON: stored re-encoded) and producers."""
    expected: dict[str, dict[str, int]] = {}
    with httpx.Client(base_url=base, timeout=10) as c:
        text = {"Content-Type": "text/plain"}
        assert c.put("text/log", headers=text).status_code == 201
        lines = [b"one\n", b"two two\n", b"three three three\n"]
        for line in lines:
            assert c.post("text/log", headers=text, content=line).is_success
        expected["text/log"] = {"records": 3, "bytes": sum(map(len, lines)), "producers": 0}

        js = {"Content-Type": "application/json"}
        assert c.put("json/orders", headers=js).status_code == 201
        assert c.post("json/orders", headers=js, content=b'[{"id":1},{"id":2}]').is_success
        assert c.post("json/orders", headers=js, content=b'{"id":3}').is_success
        expected["json/orders"] = {"records": 3, "producers": 0}

        binary = {"Content-Type": "application/octet-stream"}
        assert c.put("prod/p", headers=binary).status_code == 201
        size = 0
        for producer, count in (("alpha", 3), ("beta", 2)):
            for seq in range(count):
                body = f"{producer}-{seq}".encode() * 100
                size += len(body)
                headers = {
                    **binary,
                    "Producer-Id": producer,
                    "Producer-Epoch": "0",
                    "Producer-Seq": str(seq),
                }
                assert c.post("prod/p", headers=headers, content=body).is_success
        expected["prod/p"] = {"records": 5, "bytes": size, "producers": 2}
    return expected


def test_the_spark_image_runs_the_stats_job_on_the_server_images_volume(
    serve, podman, images, tmp_path: Path
):
    parquet = needs.module("pyarrow.parquet", install="the spark extra (make deps)")
    data = podman.own(tmp_path / "data", SERVER_UID)
    srv = serve(data)
    expected = write_streams(srv.base)
    srv.box.stop(grace=GRACE)

    out = podman.own(tmp_path / "out", SPARK_UID)
    started = time.monotonic()
    proc = podman.run_to_end(
        images["durable-streams-spark"],
        "driver",
        "--master", "local[2]",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.sql.shuffle.partitions=2",
        # The JIT's first tier only: a job of seconds spent most of its CPU in the
        # second tier's compiles (54 CPU s for the stats job here, 35 without them).
        "--driver-java-options", JVM_SHORT_JOB,
        JOB_FILE, "/data", "--out", "/out",
        env={"SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1"},
        volumes={data: "/data:ro", out: "/out"},
        timeout=900,
    )  # fmt: skip
    took = time.monotonic() - started
    report(f"stats job in the Spark container (local[2], JVM start included): {took:.0f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    rows = parquet.read_table(out / "by_stream").to_pylist()
    got = {r["stream"]: {k: r[k] for k in expected.get(r["stream"], {})} for r in rows}
    assert got == expected
    assert {r["stream"] for r in parquet.read_table(out / "by_hour").to_pylist()} == set(expected)
