"""The golden data directory of format version 1 (tests/fixtures/golden-v1), written once
by an earlier server: this server and the Spark reader must read it exactly as
``golden_v1.json`` says, forever or until a documented migration."""

from __future__ import annotations

import shutil

import httpx

from stream_format.layout import CURRENT
from stream_server.engine.recovery import RecoveryReport
from stream_server.streams.store import StreamStore
from testkit.golden import expected, golden, matches, with_recovered_copy
from testkit.spark_rows import every_stream

GOLDEN = golden(1)
EXPECTED = expected(1)["streams"]


def test_the_server_reads_the_golden_v1_directory_exactly(tmp_path):
    async def check(store: StreamStore, report: RecoveryReport) -> None:
        assert report.damaged == {} and report.streams == len(EXPECTED)
        assert sorted(store.streams) == sorted(EXPECTED)
        for path, want in EXPECTED.items():
            s = store.get(path)
            assert s.meta.content_type == want["content_type"], path
            assert s.is_json == ("messages" in want), path
            assert s.tail == want["tail"], path
            assert s.meta.closed == want.get("closed", False), path
            assert s.meta.fork_from == want.get("fork_from"), path
            if "fork_offset" in want:
                assert s.meta.fork_offset == want["fork_offset"], path
            producers = {pid: [p.epoch, p.seq] for pid, p in s.producers.items()}
            assert producers == want.get("producers", {}), path
            r = await store.read(s, 0, 1 << 30)
            assert matches(want, [bytes(p) for p in r.payloads]), path

    data = with_recovered_copy(1, tmp_path, check)
    # The server raised its copy to the current format (the fixture stays format 1),
    # and the Spark reader still reads it: only writers see what format 2 changed.
    assert (GOLDEN / "FORMAT").read_text() == "durable-streams-py data format 1\n"
    assert (data / "FORMAT").read_text() == CURRENT.text()
    assert every_stream(data) == every_stream(GOLDEN)


def test_a_server_serves_the_golden_v1_directory(app_server, tmp_path):
    data = tmp_path / "golden"
    shutil.copytree(GOLDEN, data)
    srv = app_server(data_dir=data)
    with httpx.Client(base_url=srv.base, transport=srv.transport, timeout=10) as c:
        assert c.get("bin/a", params={"offset": "-1"}).content == b"hello world"
        assert c.get("json/e", params={"offset": "-1"}).json() == [{"k": 1}, {"k": 2}, "x"]
        assert c.get("fork/f", params={"offset": "-1"}).content == b"hello there"
        h = c.head("text/closed")
        assert h.headers["stream-closed"] == "true"
        # The producer's state survived: its last sequence number is a duplicate.
        r = c.post(
            "prod/p",
            headers={
                "Content-Type": "application/octet-stream",
                "Producer-Id": "w",
                "Producer-Epoch": "1",
                "Producer-Seq": "2",
            },
            content=b"p2",
        )
        assert r.status_code == 204


def test_the_spark_reader_reads_the_golden_v1_directory_exactly():
    got, kinds = every_stream(GOLDEN)
    assert sorted(got) == sorted(EXPECTED)
    for path, want in EXPECTED.items():
        assert kinds[path] == ("messages" in want), path
        assert matches(want, got[path]), path


# ------------------------------------------------------------------ format 3

GOLDEN_V3 = golden(3)
EXPECTED_V3 = expected(3)


def test_the_server_reads_the_golden_v3_directory_keyed_values_and_all(tmp_path):
    """Format 3's keyed values (``records`` in ``golden_v3.json``, after the database's
    name), left as a crash leaves them: part in LMDB, the last put only in the WAL
    (``make_golden_v3.py``). Recovery must decode both encodings."""

    async def check(store: StreamStore, report: RecoveryReport) -> None:
        assert report.wal_frames_replayed > 0 and report.damaged == {}
        for space, want in EXPECTED_V3["records"].items():
            got = {k: v.hex() for k, v in store.keyed_values(space).items()}
            assert got == want, space
        for path, want in EXPECTED_V3["streams"].items():
            s = store.get(path)
            assert s.tail == want["tail"] and s.meta.content_type == want["content_type"]
            r = await store.read(s, 0, 1 << 30)
            assert matches(want, [bytes(p) for p in r.payloads]), path

    data = with_recovered_copy(3, tmp_path, check)
    assert (data / "FORMAT").read_text() == CURRENT.text()


def test_the_spark_reader_reads_the_golden_v3_directory_and_ignores_its_keyed_values():
    got, kinds = every_stream(GOLDEN_V3)
    assert sorted(got) == sorted(EXPECTED_V3["streams"])
    for path, want in EXPECTED_V3["streams"].items():
        assert not kinds[path] and matches(want, got[path]), path
