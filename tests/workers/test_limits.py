"""A client's limits hold across worker processes (``--workers N``): two workers in front
of one writer, each over its own link, share one rate limiter and one set of live
readers' slots, so a client whose connections land on both is limited once.

In-process: the writer's app and two worker apps on one loop, linked over real Unix
sockets (``testkit.asgi.linked_worker``); the same client address reaches both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from testkit import wait_until
from testkit.asgi import URL, InProcessServer, StreamingASGITransport, linked_worker

CT = {"Content-Type": "application/octet-stream"}
Trio = tuple[InProcessServer, httpx.AsyncClient, httpx.AsyncClient]


@pytest.fixture
async def two_workers(async_app_server) -> AsyncIterator[Callable[..., Awaitable[Trio]]]:
    """``make(*flags)``: a server reached through a worker, and a client of a second
    worker in front of the same writer."""

    async def make(*flags: str) -> Trio:
        srv = await async_app_server(*flags, worker=True)
        second = await stack.enter_async_context(linked_worker(srv.app))
        other = await stack.enter_async_context(
            httpx.AsyncClient(transport=StreamingASGITransport(second), base_url=URL, timeout=30)
        )
        assert srv.client is not None
        return srv, srv.client, other

    async with contextlib.AsyncExitStack() as stack:
        yield make


async def test_one_rate_for_a_client_whichever_worker_serves_it(two_workers):
    srv, first, second = await two_workers("--rate-limit", "0.01", "--rate-burst", "3")
    url = f"{srv.base}rate"
    assert (await first.put(url, headers=CT)).status_code == 201  # 1 of the burst of 3
    assert (await second.head(url)).status_code == 200  # 2
    assert (await first.head(url)).status_code == 200  # 3
    refused = await second.head(url)  # a limit per worker would let this one through
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1


async def test_one_set_of_live_reader_slots_whichever_worker_holds_them(two_workers):
    srv, first, second = await two_workers(
        "--max-live-readers",
        "10",
        "--max-live-readers-per-client",
        "1",
        "--long-poll-timeout",
        "30",
    )
    url = f"{srv.base}slots"
    assert (await first.put(url, headers=CT)).status_code == 201
    live = {"offset": "now", "live": "long-poll"}
    held = asyncio.create_task(first.get(url, params=live))
    await wait_until(lambda: srv.app.reader_slots.by_mode["long-poll"] == 1)
    refused = await second.get(url, params=live)  # the client's one slot is taken
    assert refused.status_code == 429
    assert (await second.post(url, headers=CT, content=b"wake")).status_code == 204
    assert (await held).status_code == 200
    await wait_until(lambda: srv.app.reader_slots.by_mode["long-poll"] == 0)
    again = asyncio.create_task(second.get(url, params={**live, "offset": "-1"}))
    assert (await again).status_code == 200  # given back: the client may hold one again


async def test_a_workers_slots_go_back_when_its_link_goes(async_app_server):
    srv = await async_app_server(
        "--max-live-readers-per-client", "1", "--long-poll-timeout", "30", worker=True
    )
    url = f"{srv.base}gone"
    async with (
        linked_worker(srv.app) as second,
        httpx.AsyncClient(
            transport=StreamingASGITransport(second), base_url=URL, timeout=30
        ) as other,
    ):
        assert (await other.put(url, headers=CT)).status_code == 201
        poll = asyncio.create_task(other.get(url, params={"offset": "now", "live": "long-poll"}))
        await wait_until(lambda: srv.app.reader_slots.by_mode["long-poll"] == 1)
        second.store.close()  # the worker's link breaks, as when it is killed
        await wait_until(lambda: srv.app.reader_slots.by_mode["long-poll"] == 0)
        with pytest.raises(RuntimeError, match="without a response"):
            await poll  # its outcome unknown to the worker: no answer at all
    assert srv.client is not None
    assert (await srv.client.post(url, headers=CT, content=b"data")).status_code == 204
    r = await srv.client.get(url, params={"offset": "-1", "live": "long-poll"})
    assert r.status_code == 200  # the slot the killed worker held is free again


async def test_a_slot_released_in_the_frame_that_took_it_is_free():
    """A reader that hangs up at once sends its hold and its release together: the writer
    must take and give back in that order, not leave a slot held forever."""
    from stream_server.protocol.live import ReaderSlots
    from stream_server.workers.host import HostLink, WriterHost

    slots = ReaderSlots(10, 1)
    host = WriterHost(None, None, lambda: True, lambda: True, None, slots)  # type: ignore[arg-type]
    link = HostLink(host)
    link.received([(7, "hold", ("long-poll", "client")), (0, "release", 7)])
    await asyncio.sleep(0)  # anything the frame started runs
    assert slots.by_mode["long-poll"] == 0 and not slots.by_client
