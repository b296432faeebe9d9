"""The Spark reader on streams that retention trims (data format 4), written by a real
server: it starts each stream at its retained start, and a slice whose head is dropped
between planning and reading yields what is still held instead of failing."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest

from stream_spark._plan import Selection, batch_ranges, plan
from stream_spark._reader import MetaReader, read_slice

pytestmark = pytest.mark.processes

TEXT = {"Content-Type": "text/plain"}
CHUNK = 4096


def chunk(i: int) -> bytes:
    return (f"{i:07d}." * (CHUNK // 8)).encode()


def earliest(url: str) -> int:
    h = httpx.head(url).headers
    return int(h.get("stream-earliest-offset", "0_0").split("_")[1])


def wait_until(what: str, check) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + 60
    while not check():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.05)


def rows(data_dir, parts) -> list:  # type: ignore[no-untyped-def]
    return [row for part in parts for sl in part for row in read_slice(data_dir, sl)]


def test_the_reader_starts_at_the_retained_start_and_survives_a_drop_mid_read(server_factory):
    srv = server_factory("--retention", "logs/:max-bytes=64KiB").start()
    url = f"{srv.base}logs/s"
    assert httpx.put(url, headers=TEXT).status_code == 201
    with httpx.Client() as c:
        for i in range(100):
            assert c.post(url, headers=TEXT, content=chunk(i)).status_code == 204
    wait_until("a drop", lambda: earliest(url) > 0)
    with MetaReader(srv.data_dir) as meta:
        cut = meta.cut()
        info = cut.streams["logs/s"]
        first = cut.earliest("logs/s")
        assert first > 0 and first == info.start
        parts = plan(cut, meta, batch_ranges(cut, Selection()))
    got = rows(srv.data_dir, parts)
    assert got[0].start == first and got[-1].stop == info.tail == 100 * CHUNK
    assert b"".join(bytes(r.payload) for r in got) == b"".join(
        chunk(i) for i in range(first // CHUNK, 100)
    )
    # More appends: the server drops past the start the plan above was made at.
    with httpx.Client() as c:
        for i in range(100, 108):
            assert c.post(url, headers=TEXT, content=chunk(i)).status_code == 204
    wait_until("a drop past the planned start", lambda: earliest(url) >= first + 6 * CHUNK)
    later = rows(srv.data_dir, parts)  # the old plan, read now
    assert later, "the slice still holds the newest records of the cut"
    assert first < later[0].start and later[-1].stop == info.tail
    units = [(r.start, r.stop) for r in later]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(units))
    assert b"".join(bytes(r.payload) for r in later) == b"".join(
        chunk(i) for i in range(later[0].start // CHUNK, 100)
    )
