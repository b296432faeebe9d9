"""Retention against real server processes: a bounded stream under continuous appends
with live readers, 410 before the retained start, and crashes around a drop.

Disk use is measured on the real segment file (allocated blocks, ``st_blocks``),
after the sweeper has caught up with the appends: how far it runs ahead of the
bound while appends continue depends on the machine, so it is printed, not
asserted.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import orjson
import pytest

from testkit import wait_for

pytestmark = pytest.mark.processes

TEXT = {"Content-Type": "text/plain"}
KIB = 1024
BOUND = 256 * KIB
CHUNK = 4 * KIB
T = TypeVar("T")
SLACK = 4 * 4096  # the header's block, the partly dropped block, the last one, one spare


def chunk(i: int) -> bytes:
    return (f"{i:07d}." * (CHUNK // 8)).encode()


def segment_file(data_dir: Path) -> Path:
    (path,) = (data_dir / "segments").glob("*/*.log")
    return path


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def offset(unit: int) -> str:
    return f"0000000000000000_{unit:016d}"


def unit_of(header: str) -> int:
    return int(header.split("_")[1])


class Reader(threading.Thread):
    """A live reader from offset 0 to unit ``total``: what it got, and whether it was
    sent away (410) because retention dropped what it had yet to read."""

    def __init__(self, url: str, total: int) -> None:
        super().__init__(daemon=True)
        self.url, self.total = url, total
        self.data = bytearray()
        self.gone = False


class LongPollReader(Reader):
    def run(self) -> None:
        with httpx.Client(timeout=30) as c:
            at = 0
            while at < self.total:
                r = c.get(self.url, params={"offset": offset(at), "live": "long-poll"})
                if r.status_code == 410:
                    self.gone = True
                    return
                if r.status_code == 200:
                    self.data += r.content
                at = unit_of(r.headers["stream-next-offset"])


class SseReader(Reader):
    def run(self) -> None:
        at = 0
        with httpx.Client(timeout=30) as c:
            while at < self.total:
                params = {"offset": offset(at), "live": "sse"}
                with c.stream("GET", self.url, params=params) as r:
                    if r.status_code == 410:
                        self.gone = True
                        return
                    event, lines = "", []
                    for line in r.iter_lines():
                        if line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("data:"):
                            lines.append(line[5:].removeprefix(" "))
                        elif not line and event:
                            body = "\n".join(lines)
                            if event == "data":
                                self.data += body.encode()
                            elif event == "control":
                                at = unit_of(orjson.loads(body)["streamNextOffset"])
                                if at >= self.total:
                                    return
                            event, lines = "", []


def until(what: str, check: Callable[[], T | None]) -> T:
    """Wait for the sweeper (or a crash), not timing it."""
    return wait_for(check, timeout=60.0, message=what)


def head(url: str) -> httpx.Response:
    r = httpx.head(url)
    assert r.status_code == 200
    return r


def settled(url: str, bound: int) -> int | None:
    """The earliest retained unit once the sweeper has brought the stream within ``bound``."""
    r = head(url)
    tail = unit_of(r.headers["stream-next-offset"])
    first = unit_of(r.headers.get("stream-earliest-offset", offset(0)))
    records = (tail - first) // CHUNK
    return first if records * (CHUNK + 28) <= bound and first > 0 else None


def test_max_bytes_bounds_the_disk_under_appends_and_live_readers_miss_nothing(server_factory):
    srv = server_factory(
        "--retention", f"logs/:max-bytes={BOUND // KIB}KiB", "--long-poll-timeout", "5"
    ).start()
    url = f"{srv.base}logs/s"
    assert httpx.put(url, headers=TEXT).status_code == 201
    n = 400  # 1.6 MiB through a 256 KiB bound
    expected = b"".join(chunk(i) for i in range(n))
    readers = [LongPollReader(url, len(expected)), SseReader(url, len(expected))]
    for r in readers:
        r.start()
    most = 0
    with httpx.Client(timeout=30) as c:
        for i in range(n):
            assert c.post(url, headers=TEXT, content=chunk(i)).status_code == 204
            if i == 0:  # a 4 KiB append: the log has its own file from here (format 5)
                seg = segment_file(srv.data_dir)
            most = max(most, allocated(seg))
    for r in readers:
        r.join(60)
        assert not r.is_alive()
        # Every byte from the reader's offset on, in order, without a gap: to the end,
        # or (had it fallen behind the retained start) up to an explicit 410.
        assert bytes(r.data) == expected[: len(r.data)]
        assert len(r.data) == len(expected) or r.gone
    first = until("the sweeper brings the stream within its bound", lambda: settled(url, BOUND))
    on_disk = allocated(seg)
    print(f"\nmax-bytes {BOUND} B: {on_disk} B allocated once settled, {most} B at most during")
    print(f"appends ({n} x {CHUNK} B); file size {os.stat(seg).st_size} B")
    assert on_disk <= BOUND + SLACK
    assert first % CHUNK == 0  # whole appends only
    # An offset before the retained start: 410 and where to start instead.
    old = httpx.get(url, params={"offset": offset(0)})
    assert old.status_code == 410
    assert old.headers["stream-earliest-offset"] == offset(first)
    assert "Stream-Earliest-Offset" in old.headers["access-control-expose-headers"]
    # offset=-1 reads from the retained start; its ETag names that start.
    r = httpx.get(url, params={"offset": "-1"})
    assert r.status_code == 200
    assert r.content == expected[first : first + len(r.content)]
    assert offset(first) in r.headers["etag"]
    assert head(url).headers["stream-earliest-offset"] == offset(first)
    # Metrics: what was given back, and per policy (label: its prefix) what is held.
    text = httpx.get(f"{srv.url}/metrics").text
    series = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("durable_streams_ret")
    )
    assert float(series["durable_streams_retention_reclaimed_bytes_total"]) >= 1024 * KIB
    assert 0 < float(series['durable_streams_retention_retained_bytes{policy="logs/"}']) <= BOUND
    assert float(series['durable_streams_retention_oldest_age_seconds{policy="logs/"}']) >= 0


@pytest.mark.parametrize("crash", ["at-punch", "after-drop"])
def test_a_crash_around_a_drop_leaves_one_start_and_no_leaked_space(server_factory, crash):
    """``at-punch``: the process dies (as kill -9) right after the new start committed,
    before any block is punched (a policy added to a full stream: the first drop is
    large). ``after-drop``: killed after drops, with the WAL that
    rewrites the dropped records on replay still there. Restarted without a policy, so
    that only recovery can give the space back."""
    bound = 64 * KIB
    policy = ("--retention", f"logs/:max-bytes={bound // KIB}KiB")
    if crash == "at-punch":
        # 800 KiB written without a policy, so that the first drop has much to punch.
        first = server_factory().start()
        url = f"{first.base}logs/s"
        assert httpx.put(url, headers=TEXT).status_code == 201
        with httpx.Client(timeout=30) as c:
            for i in range(200):
                assert c.post(url, headers=TEXT, content=chunk(i)).status_code == 204
        first.stop()
        srv = server_factory(*policy, data_dir=first.data_dir, env={"DS_FAULT": "crash:punch:1"})
        with contextlib.suppress(Exception):  # the crash is the point
            srv.start(timeout=10)  # the first sweep crashes it, maybe before it is ready
        until("the injected crash", lambda: srv.proc is not None and srv.proc.poll() == 137)
    else:
        srv = server_factory(*policy).start()
        url = f"{srv.base}logs/s"
        assert httpx.put(url, headers=TEXT).status_code == 201
        with httpx.Client(timeout=30) as c:
            for i in range(200):
                assert c.post(url, headers=TEXT, content=chunk(i)).status_code == 204
        until("a drop", lambda: settled(url, bound))
        srv.kill()
    acked = 200
    seg = segment_file(srv.data_dir)
    before = allocated(seg)
    again = server_factory(data_dir=srv.data_dir).start()  # no retention: recovery alone
    url = f"{again.base}logs/s"
    h = head(url)
    first = unit_of(h.headers["stream-earliest-offset"])
    tail = unit_of(h.headers["stream-next-offset"])
    expected = b"".join(chunk(i) for i in range(tail // CHUNK))
    assert tail >= acked * CHUNK and first > 0 and first % CHUNK == 0
    r = httpx.get(url, params={"offset": "-1"})
    assert r.status_code == 200 and r.content == expected[first:]
    assert httpx.get(url, params={"offset": offset(first - 1)}).status_code == 410
    on_disk = allocated(seg)
    print(f"\n{crash}: {before} B allocated after the crash, {on_disk} B after recovery")
    assert on_disk <= (tail - first) // CHUNK * (CHUNK + 28) + SLACK
    assert [p.name for p in srv.data_dir.iterdir() if p.name.endswith(".tmp")] == []
    assert len(list((srv.data_dir / "segments").glob("*/*"))) == 1
