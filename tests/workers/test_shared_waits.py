"""A worker's readers of one stream at one unit share one wait at the writer: a fan-out
costs the serial writer one answer per worker, and each reader still gets exactly what
it would have had alone (woken with the data, left alone when it hangs up, timed out at
its own deadline)."""

from __future__ import annotations

import asyncio

from testkit import wait_until

CT = {"Content-Type": "application/octet-stream"}


def writer_waits(srv, path: str) -> int:
    """The waits the writer holds at ``path``: the link's calls it has not answered."""
    return len(srv.app.store.get(path).waiters or ())


async def test_five_long_polls_are_one_wait_at_the_writer_and_all_are_woken(async_app_server):
    srv = await async_app_server("--long-poll-timeout", "30", worker=True)
    http, url = srv.client, f"{srv.base}fan"
    assert (await http.put(url, headers=CT)).status_code == 201
    start = {"offset": "0000000000000000_0000000000000000", "live": "long-poll"}
    polls = [asyncio.create_task(http.get(url, params=start)) for _ in range(5)]
    await wait_until(lambda: srv.app.reader_slots.by_mode["long-poll"] == 5)
    await wait_until(lambda: writer_waits(srv, "fan") == 1, within=5)
    assert writer_waits(srv, "fan") == 1 and srv.worker.store.shared
    assert (await http.post(url, headers=CT, content=b"fan-out")).status_code == 204
    for answer in await asyncio.gather(*polls):
        assert answer.status_code == 200 and answer.content == b"fan-out"
    assert not srv.worker.store.shared and not srv.worker.store.calls  # all answered


async def test_readers_that_hang_up_leave_and_the_last_one_ends_the_writers_wait(
    async_app_server,
):
    srv = await async_app_server(worker=True)
    store, loop = srv.worker.store, asyncio.get_running_loop()
    assert (await srv.client.put(f"{srv.base}hang", headers=CT)).status_code == 201
    deadline = loop.time() + 60
    streams = [await store.open("hang") for _ in range(3)]
    hangups = [loop.create_future() for _ in streams]
    waits = [
        asyncio.create_task(store.wait(s, 0, deadline, until))
        for s, until in zip(streams, hangups, strict=True)
    ]
    await wait_until(lambda: writer_waits(srv, "hang") == 1)
    hangups[0].set_result(None)
    assert await waits[0] is False  # at once, not when the writer answers
    waits[1].cancel()  # a reader's task cancelled leaves as well
    await asyncio.gather(waits[1], return_exceptions=True)
    assert writer_waits(srv, "hang") == 1  # the third still waits
    hangups[2].set_result(None)
    assert await waits[2] is False
    await wait_until(lambda: writer_waits(srv, "hang") == 0, message="the writer still waits")
    assert not store.shared
    await wait_until(lambda: not store.calls, message="the writer did not answer the cancel")


async def test_a_reader_that_joined_later_waits_to_its_own_deadline(async_app_server):
    """The shared wait ends at its first reader's deadline; one that joined with a later
    deadline waits on, and is still woken by the append."""
    srv = await async_app_server(worker=True)
    store, loop = srv.worker.store, asyncio.get_running_loop()
    assert (await srv.client.put(f"{srv.base}late", headers=CT)).status_code == 201
    early, late = await store.open("late"), await store.open("late")
    first = asyncio.create_task(store.wait(early, 0, loop.time() + 0.3))
    await wait_until(lambda: writer_waits(srv, "late") == 1)
    second = asyncio.create_task(store.wait(late, 0, loop.time() + 60))
    assert await first is False  # its deadline passed
    await wait_until(lambda: writer_waits(srv, "late") == 1, message="the later one stopped")
    assert not second.done()
    assert (await srv.client.post(f"{srv.base}late", headers=CT, content=b"x")).status_code == 204
    assert await second is True and late.tail == 1


async def test_readers_at_other_units_or_streams_wait_apart(async_app_server):
    srv = await async_app_server(worker=True)
    store, loop = srv.worker.store, asyncio.get_running_loop()
    for name in ("a", "b"):
        assert (await srv.client.put(f"{srv.base}{name}", headers=CT)).status_code == 201
    assert (await srv.client.post(f"{srv.base}a", headers=CT, content=b"12")).status_code == 204
    deadline = loop.time() + 60
    at_tail, at_one, other = await store.open("a"), await store.open("a"), await store.open("b")
    at_one.tail = 1  # as a reader whose last read ended at unit 1 would see it
    tasks = [
        asyncio.create_task(store.wait(at_tail, 2, deadline)),
        asyncio.create_task(store.wait(other, 0, deadline)),
    ]
    await wait_until(lambda: len(store.shared) == 2)
    assert await store.wait(at_one, 1, deadline) is True  # the writer has past 1: at once
    assert len(store.shared) == 2
    assert (await srv.client.post(f"{srv.base}b", headers=CT, content=b"z")).status_code == 204
    assert await tasks[1] is True and not tasks[0].done()
    assert (await srv.client.post(f"{srv.base}a", headers=CT, content=b"3")).status_code == 204
    assert await tasks[0] is True and at_tail.tail == 3


async def test_sse_readers_of_one_stream_each_get_every_append(async_app_server):
    """SSE readers wait again at each new tail: they share each wait as they go, and
    each still sees every append, in order."""
    srv = await async_app_server("--sse-reconnect-interval", "600", worker=True)
    http, url = srv.client, f"{srv.base}feed"
    text = {"Content-Type": "text/plain"}
    assert (await http.put(url, headers=text)).status_code == 201
    bodies = [f"<{i}>".encode() for i in range(5)]

    async def follow() -> bytes:
        seen = b""
        async with http.stream("GET", url, params={"offset": "-1", "live": "sse"}) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_bytes():
                seen += chunk
                if bodies[-1] in seen:
                    return seen
        return seen

    readers = [asyncio.create_task(follow()) for _ in range(3)]
    await wait_until(lambda: writer_waits(srv, "feed") == 1)
    for body in bodies:
        await wait_until(lambda: writer_waits(srv, "feed") == 1)  # waiting at the tail again
        assert (await http.post(url, headers=text, content=body)).status_code == 204
    for seen in await asyncio.gather(*readers):
        positions = [seen.index(body) for body in bodies]
        assert positions == sorted(positions)
