"""The golden data directory of format version 4 (tests/fixtures/golden-v4): streams
trimmed by retention, the last drop only in the WAL (``make_golden_v4.py``). This
server and the Spark reader must read it exactly as ``golden_v4.json`` says."""

from __future__ import annotations

import pytest

from stream_format.layout import CURRENT
from stream_server.engine.recovery import RecoveryReport
from stream_server.streams.errors import OffsetGone
from stream_server.streams.store import StreamStore
from testkit.golden import (
    expected,
    served_as_expected,
    spark_reads_as_expected,
    with_recovered_copy,
)

EXPECTED = expected(4)["streams"]


def test_the_server_reads_the_golden_v4_directory_from_its_retained_starts(tmp_path):
    async def check(store: StreamStore, report: RecoveryReport) -> None:
        assert report.wal_frames_replayed > 0 and report.damaged == {}
        await served_as_expected(store, EXPECTED)
        for path, want in EXPECTED.items():
            s = store.get(path)
            with pytest.raises(OffsetGone):
                await store.read(s, want["earliest"] - 1, 1 << 30)

    data = with_recovered_copy(4, tmp_path, check)
    assert (data / "FORMAT").read_text() == CURRENT.text()


def test_the_spark_reader_reads_the_recovered_golden_v4_directory_from_its_starts(tmp_path):
    """A crashed directory is recovered first (as ``python -m stream_server.recover``
    does): the last drop is only in the WAL, and below it the file holds holes."""
    spark_reads_as_expected(4, tmp_path)
