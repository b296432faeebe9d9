"""The write path's wake-up (``replication/primary/signal.py``): a notify wakes every waiter
of the moment and none that comes later; a wait ends by itself at its timeout; a
waiter that times out or is cancelled is not kept."""

from __future__ import annotations

import asyncio

import pytest

from stream_server.replication.primary.signal import Signal


async def test_notify_wakes_every_current_waiter_and_not_a_later_one():
    s = Signal()
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await s.wait(30)
        woken.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert len(s) == 3
    s.notify()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert sorted(woken) == [0, 1, 2]
    late = asyncio.create_task(s.wait(30))  # after the notify: waits for the next one
    await asyncio.sleep(0.05)
    assert not late.done()
    s.notify()
    await asyncio.wait_for(late, 5)
    assert len(s) == 0


async def test_a_wait_ends_at_its_timeout_and_leaves_nothing_behind():
    s = Signal()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await s.wait(0.05)
    assert loop.time() - started >= 0.04
    assert len(s) == 0


async def test_a_cancelled_waiter_is_dropped():
    s = Signal()
    task = asyncio.create_task(s.wait(30))
    await asyncio.sleep(0)
    assert len(s) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(s) == 0
    s.notify()  # nothing left to wake
