"""The golden data directory of format version 4 (tests/fixtures/golden-v4): streams
trimmed by retention, the last drop only in the WAL (``make_golden_v4.py``). This
server and the Spark reader must read it exactly as ``golden_v4.json`` says."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from stream_format.layout import CURRENT
from stream_server.streams.errors import OffsetGone
from stream_server.streams.store import StreamStore
from testkit.spark_rows import every_stream

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN_V4 = FIXTURES / "golden-v4"
EXPECTED = json.loads((FIXTURES / "golden_v4.json").read_text())["streams"]


def content_of(want: dict, payloads: list[bytes]) -> object:
    if "messages" in want:
        return [p.decode() for p in payloads]
    return b"".join(payloads).hex()


def expected_of(want: dict) -> object:
    return want["messages"] if "messages" in want else want["bytes_hex"]


def test_the_server_reads_the_golden_v4_directory_from_its_retained_starts(tmp_path):
    data = tmp_path / "golden-v4"
    shutil.copytree(GOLDEN_V4, data)

    async def check() -> None:
        store = StreamStore(data)
        report = await store.start()
        try:
            assert report.wal_frames_replayed > 0 and report.damaged == {}
            for path, want in EXPECTED.items():
                s = store.get(path)
                assert (store.earliest(s), s.tail) == (want["earliest"], want["tail"]), path
                assert s.meta.content_type == want["content_type"]
                r = await store.read(s, want["earliest"], 1 << 30)
                assert content_of(want, [bytes(p) for p in r.payloads]) == expected_of(want)
                with pytest.raises(OffsetGone):
                    await store.read(s, want["earliest"] - 1, 1 << 30)
        finally:
            await store.stop()

    asyncio.run(check())
    assert (data / "FORMAT").read_text() == CURRENT.text()


def test_the_spark_reader_reads_the_recovered_golden_v4_directory_from_its_starts(tmp_path):
    """A crashed directory is recovered first (as ``python -m stream_server.recover``
    does): the last drop is only in the WAL, and below it the file holds holes."""
    data = tmp_path / "golden-v4"
    shutil.copytree(GOLDEN_V4, data)

    async def recover() -> None:
        store = StreamStore(data)
        await store.start()
        await store.stop()

    asyncio.run(recover())
    got, _ = every_stream(data)
    assert sorted(got) == sorted(EXPECTED)
    for path, want in EXPECTED.items():
        assert content_of(want, got[path]) == expected_of(want), path
