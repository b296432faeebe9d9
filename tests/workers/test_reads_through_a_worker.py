"""A worker's own reads of the data directory answer as the writer would: after retention
dropped a stream's head (410 with the earliest offset, HEAD saying it), across a fork's
pieces, and for a small stream whose log moved from LMDB to its file meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from testkit import wait_until

CT = {"Content-Type": "application/octet-stream"}
CHUNK = b"r" * 4096


async def test_after_retention_dropped_the_head(async_app_server):
    srv = await async_app_server("--retention", "r/:max-bytes=64KiB", worker=True)
    http, url = srv.client, f"{srv.base}r/one"
    assert (await http.put(url, headers=CT)).status_code == 201
    for _ in range(64):  # 256 KiB into a 64 KiB bound
        assert (await http.post(url, headers=CT, content=CHUNK)).status_code == 204
    store = srv.app.store
    s = store.get("r/one")
    await wait_until(lambda: _within_bound(store, s), message="not dropped to the bound")
    first = store.earliest(s)
    head = await http.head(url)
    earliest = head.headers["stream-earliest-offset"]
    old = await http.get(url, params={"offset": "0000000000000000_0000000000000000"})
    assert old.status_code == 410
    assert old.headers["stream-earliest-offset"] == earliest
    kept = await http.get(url, params={"offset": earliest})
    assert kept.status_code == 200
    assert len(kept.content) == s.tail - first and set(kept.content) == {ord("r")}


async def test_a_fork_read_across_its_source_and_its_own_log(async_app_server):
    srv = await async_app_server(worker=True)
    http = srv.client
    src, fork = f"{srv.base}src", f"{srv.base}fork"
    assert (await http.put(src, headers=CT, content=b"a" * 3000)).status_code == 201
    forked = {**CT, "Stream-Forked-From": "/v1/stream/src"}
    assert (await http.put(fork, headers=forked)).status_code == 201
    assert (await http.post(fork, headers=CT, content=b"b" * 10)).status_code == 204
    assert (await http.post(src, headers=CT, content=b"c" * 10)).status_code == 204
    assert (await http.get(fork, params={"offset": "-1"})).content == b"a" * 3000 + b"b" * 10


async def test_a_small_stream_that_grows_out_of_lmdb(async_app_server):
    srv = await async_app_server(worker=True)
    http, url = srv.client, f"{srv.base}grows"
    assert (await http.put(url, headers=CT, content=b"x" * 100)).status_code == 201
    assert (await http.get(url, params={"offset": "-1"})).content == b"x" * 100  # inline
    assert (await http.post(url, headers=CT, content=b"y" * 4000)).status_code == 204
    assert (await http.get(url, params={"offset": "-1"})).content == b"x" * 100 + b"y" * 4000


async def test_a_woken_long_poll_gets_the_commit_small_or_large(async_app_server):
    """A small wake comes in the wait's answer, a large one (past what an answer carries)
    is read from the data directory: either way the reader gets exactly what was
    appended."""
    srv = await async_app_server("--long-poll-timeout", "30", worker=True)
    http, url = srv.client, f"{srv.base}woken"
    assert (await http.put(url, headers=CT)).status_code == 201
    offset = "0000000000000000_0000000000000000"
    for body in (b"s" * 100, b"L" * (200 * 1024)):
        poll = asyncio.create_task(http.get(url, params={"offset": offset, "live": "long-poll"}))
        await wait_until(lambda: srv.app.reader_slots.by_mode["long-poll"] == 1)
        assert (await http.post(url, headers=CT, content=body)).status_code == 204
        answer = await poll
        assert answer.status_code == 200 and answer.content == body
        offset = answer.headers["stream-next-offset"]


JSON = {"Content-Type": "application/json"}


async def test_a_json_append_split_by_the_worker_is_refused_in_the_protocols_order(
    async_app_server,
):
    """The worker splits a JSON body for the writer; one it cannot split goes whole, so a
    missing stream is still 404 before the body's 400, and a closed one 409."""
    srv = await async_app_server(worker=True)
    http, url = srv.client, f"{srv.base}j"
    assert (await http.post(f"{srv.base}nothing", headers=JSON, content=b"[1,")).status_code == 404
    assert (await http.put(url, headers=JSON)).status_code == 201
    assert (await http.post(url, headers=JSON, content=b"[1,")).status_code == 400
    assert (await http.post(url, headers=JSON, content=b'[{"a":1},2,"three"]')).status_code == 204
    got = await http.get(url, params={"offset": "-1"})
    assert got.json() == [{"a": 1}, 2, "three"]
    closed = {**JSON, "Stream-Closed": "true"}
    assert (await http.post(url, headers=closed)).status_code == 204
    assert (await http.post(url, headers=JSON, content=b"[4,")).status_code == 409


async def test_a_drop_that_overtakes_a_workers_read_is_410_not_damage(async_app_server):
    """The worker read with the tail the writer named when it opened the stream; retention
    dropped the head meanwhile. The punched bytes must read as 'dropped' (410), never as a
    damaged log (500), and the stream must not stay marked damaged in the worker."""
    from stream_server.streams.errors import OffsetGone

    srv = await async_app_server("--retention", "r/:max-bytes=64KiB", worker=True)
    http, url = srv.client, f"{srv.base}r/race"
    assert (await http.put(url, headers=CT)).status_code == 201
    for _ in range(8):
        assert (await http.post(url, headers=CT, content=CHUNK)).status_code == 204
    assert srv.worker is not None
    stale = await srv.worker.store.open("r/race")  # the snapshot a read began with
    assert stale.first == 0
    for _ in range(64):  # the head is dropped, its blocks punched
        assert (await http.post(url, headers=CT, content=CHUNK)).status_code == 204
    store = srv.app.store
    s = store.get("r/race")
    await wait_until(lambda: _within_bound(store, s), message="not dropped to the bound")
    with pytest.raises(OffsetGone):
        await srv.worker.store.read(stale, 0, 1 << 20)
    fresh = await http.get(
        url, params={"offset": (await http.head(url)).headers["stream-earliest-offset"]}
    )
    assert fresh.status_code == 200 and set(fresh.content) == {ord("r")}


def _within_bound(store, s) -> bool:
    """Retention's own measure (the records' bytes in the file, headers included) at its
    bound: no more drops come, so offsets read from HEAD stay readable."""
    tail = store.engine.tails[s.id]
    return tail.file_len - tail.start_pos <= 64 * 1024
