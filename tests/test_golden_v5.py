"""The golden data directory of format version 5 (tests/fixtures/golden-v5): small logs
inline in LMDB, one moved into its file, and a move whose LMDB commit and new file a
crash lost, so that only its WAL frame holds it (``make_golden_v5.py``). This server and
the Spark reader must read it exactly as ``golden_v5.json`` says."""

from __future__ import annotations

from stream_format.layout import CURRENT, Layout
from stream_server.engine.recovery import RecoveryReport
from stream_server.streams.store import StreamStore
from testkit.golden import (
    expected,
    served_as_expected,
    spark_reads_as_expected,
    with_recovered_copy,
)

EXPECTED = expected(5)["streams"]


def test_the_server_reads_the_golden_v5_directory_inline_logs_and_files(tmp_path):
    async def check(store: StreamStore, report: RecoveryReport) -> None:
        assert report.wal_frames_replayed > 0 and report.damaged == {}
        await served_as_expected(store, EXPECTED)
        inline = store.engine.segments.inline
        assert {store.get(p).id in inline for p in EXPECTED if p.startswith("small/")} == {True}
        assert not {store.get(p).id for p in EXPECTED if p.startswith("moved/")} & inline
        late = store.get("moved/late").id
        assert Layout(store.engine.layout.root).segment_path(late).exists()  # rebuilt

    data = with_recovered_copy(5, tmp_path, check)
    assert (data / "FORMAT").read_text() == CURRENT.text()


def test_the_spark_reader_reads_the_recovered_golden_v5_directory(tmp_path):
    spark_reads_as_expected(5, tmp_path)
