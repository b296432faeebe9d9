"""A read from the start (offset -1) that retention overtakes, between the earliest
offset being looked up and the data being read, reads from the new start: the client
asked for the earliest retained data, which is never gone. So for a catch-up read, a
long-poll's and an SSE connection's first read. An offset the client named below the
start is still 410.

A binary catch-up larger than one read is streamed in chunks: its first chunk is read
before the status is sent, so the same holds for it, and an overtaken named offset is a
410, not a 200 cut short.

A worker reads the data directory as of the snapshot it opened, and meets an overtaking
drop only where the drop's punched blocks are (``workers/local_reads.py``); the same
retry then applies, in the same protocol code."""

from __future__ import annotations

import base64

import pytest

CT = {"Content-Type": "application/octet-stream"}
CHUNK = b"r" * 1024
BOUND = 8 * 1024


async def overtaken_stream(async_app_server, monkeypatch, *flags: str):
    """A stream past its bound (within the sweeper's slack, so no drop yet), whose next
    read is overtaken: retention drops its head just before the data is read. The
    server, the stream's URL, and the list the drop's count goes in."""
    srv = await async_app_server("--retention", f"r/:max-bytes={BOUND}", *flags)
    store = srv.app.store
    store.retention.stop()  # drops happen when this test says, not on their own
    url = f"{srv.base}r/one"
    assert (await srv.client.put(url, headers=CT)).status_code == 201
    for _ in range(12):  # 12 KiB into an 8 KiB bound
        assert (await srv.client.post(url, headers=CT, content=CHUNK)).status_code == 204
    overtaken: list[int] = []
    real = store.read

    async def overtaken_read(s, start, max_bytes):
        if not overtaken:  # after the start was looked up
            overtaken.append(await store.retention.sweep())
        return await real(s, start, max_bytes)

    monkeypatch.setattr(store, "read", overtaken_read)
    return srv, url, overtaken


@pytest.mark.parametrize("live", [None, "long-poll"], ids=["catch-up", "long-poll"])
async def test_a_read_from_the_start_overtaken_by_retention_reads_from_the_new_start(
    async_app_server, monkeypatch, live
):
    srv, url, overtaken = await overtaken_stream(async_app_server, monkeypatch)
    params = {"offset": "-1"} | ({"live": live} if live else {})
    r = await srv.client.get(url, params=params)
    assert overtaken == [1]  # the drop did come between the lookup and the read
    assert r.status_code == 200, r.text
    assert 0 < len(r.content) <= BOUND and set(r.content) == {ord("r")}
    gone = await srv.client.get(url, params={"offset": "0000000000000000_0000000000000000"})
    assert gone.status_code == 410  # a named offset below the start is gone


async def test_a_streamed_catch_up_from_the_start_overtaken_by_retention_reads_from_it(
    async_app_server, monkeypatch
):
    # Reads of at most 2 KiB: the 12 KiB stream's catch-up is streamed in chunks.
    flags = ("--max-read-bytes", "2048")
    srv, url, overtaken = await overtaken_stream(async_app_server, monkeypatch, *flags)
    r = await srv.client.get(url, params={"offset": "-1"})
    assert overtaken == [1]
    assert r.status_code == 200, r.text
    assert len(r.content) == 2048 and set(r.content) == {ord("r")}
    assert int(r.headers["content-length"]) == 2048

    named = "0000000000000000_0000000000002048"  # retained when looked up, then dropped
    srv, url, overtaken = await overtaken_stream(async_app_server, monkeypatch, *flags)
    gone = await srv.client.get(url, params={"offset": named})
    assert overtaken == [1]
    assert gone.status_code == 410, gone.status_code


async def test_an_sse_read_from_the_start_overtaken_by_retention_sends_from_the_new_start(
    async_app_server, monkeypatch
):
    srv, url, overtaken = await overtaken_stream(async_app_server, monkeypatch)
    events: list[str] = []
    async with srv.client.stream("GET", url, params={"offset": "-1", "live": "sse"}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            events.append(line)
            if line.startswith("event: control"):
                break  # the first read's data event came, whole
    assert overtaken == [1]
    data = [line[len("data:") :].strip() for line in events if line.startswith("data:")]
    sent = base64.b64decode("".join(data))
    assert 0 < len(sent) <= BOUND and set(sent) == {ord("r")}, events[:3]
