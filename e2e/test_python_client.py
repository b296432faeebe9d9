"""The official Python client (``durable-streams`` on PyPI) against a real server process."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from testkit import needs

pytestmark = pytest.mark.processes

ds = needs.module("durable_streams", install="the dev extra: make deps, or pip install -e '.[dev]'")


def _collect(res, n: int, out: list, *, json: bool = True) -> None:
    it = res.iter_json() if json else res.iter_text()
    for item in it:
        out.append(item)
        if len(out) >= n:
            break
    res.close()


def test_create_append_and_catch_up(shared_server):
    url = f"{shared_server.base}client/catch-up"
    with ds.DurableStream.create(url, content_type="application/json", batching=False) as h:
        for i in range(5):
            h.append({"n": i})
        # The client wraps each value in an array and the server flattens one
        # level, so a list value arrives as one message.
        h.append([{"n": 5}, {"n": 6}])
        head = h.head()
        with h.stream(live=False) as res:
            items = list(res.iter_json())
    assert items == [*({"n": i} for i in range(5)), [{"n": 5}, {"n": 6}]]
    assert head.offset.endswith(f"{6:016d}")


def test_text_stream_and_offsets_resume(shared_server):
    url = f"{shared_server.base}client/text"
    with ds.DurableStream.create(url, content_type="text/plain", batching=False) as h:
        first = h.append("hello ")
        h.append("world")
        with h.stream(offset=first.next_offset, live=False) as res:
            assert res.read_bytes() == b"world"
        with ds.stream(url, live=False) as res:
            assert res.read_bytes() == b"hello world"


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_live_reads_see_new_appends(shared_server, live):
    url = f"{shared_server.base}client/live-{live}"
    with ds.DurableStream.create(url, content_type="application/json", batching=False) as h:
        h.append({"n": 0})
        got: list = []
        res = h.stream(offset="now", live=live)
        reader = threading.Thread(target=_collect, args=(res, 3, got))
        reader.start()
        time.sleep(0.3)
        for i in range(1, 4):
            h.append({"n": i})
        reader.join(timeout=15)
    assert not reader.is_alive(), "live reader never saw the appends"
    assert got == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_idempotent_producer_through_the_client(shared_server):
    """The client has no producer API of its own: producer headers ride on the handle,
    and a retried batch with the same (id, epoch, seq) is stored once."""
    url = f"{shared_server.base}client/producer"
    seq = itertools.count()
    current = {"seq": 0}

    def next_seq() -> str:
        current["seq"] = next(seq)
        return str(current["seq"])

    headers = {"Producer-Id": "client-test", "Producer-Epoch": "0", "Producer-Seq": next_seq}
    ds.DurableStream.create(url, content_type="application/json").close()
    with ds.DurableStream(
        url, headers=headers, content_type="application/json", batching=False
    ) as h:
        h.append({"n": 0})
        h.append({"n": 1})
    # A retry of seq 1 (same tuple) is acknowledged but not stored again.
    retry = {"Producer-Id": "client-test", "Producer-Epoch": "0", "Producer-Seq": "1"}
    with ds.DurableStream(url, headers=retry, content_type="application/json", batching=False) as h:
        h.append({"n": 1})
    with ds.stream(url, live=False) as res:
        assert list(res.iter_json()) == [{"n": 0}, {"n": 1}]
    # A zombie with an older epoch is fenced.
    bump = {"Producer-Id": "client-test", "Producer-Epoch": "1", "Producer-Seq": "0"}
    with ds.DurableStream(url, headers=bump, content_type="application/json", batching=False) as h:
        h.append({"n": 2})
    zombie = {"Producer-Id": "client-test", "Producer-Epoch": "0", "Producer-Seq": "2"}
    with (
        ds.DurableStream(url, headers=zombie, content_type="application/json", batching=False) as h,
        pytest.raises(ds.DurableStreamError),
    ):
        h.append({"n": 99})
    with ds.stream(url, live=False) as res:
        assert list(res.iter_json()) == [{"n": 0}, {"n": 1}, {"n": 2}]
