"""A standby's fetch is given up once the Lease names another primary or term.

A fetch to a primary that is paused or cut off never gets its answer; the standby
would wait out ``FETCH_TIMEOUT`` (15 s) before following the primary the Lease now
names, and a new primary needs its standbys in sync before it acknowledges anything
(a stream's own watch ends its read in a retry period). ``unless_stale`` gives the
request up as soon as it is no longer wanted, and only then.
"""

from __future__ import annotations

import asyncio

from stream_server.replication.follower import unless_stale


async def test_a_request_no_longer_wanted_is_given_up_and_cancelled():
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    looked: list[int] = []

    def stale() -> bool:
        looked.append(1)
        return len(looked) >= 3  # the Lease changes by the third look

    assert await unless_stale(never, stale, 0.01) is None
    assert len(looked) == 3
    await asyncio.sleep(0)
    assert never.cancelled()


async def test_an_answer_comes_back_while_it_is_wanted():
    async def answered() -> str:
        await asyncio.sleep(0.05)
        return "frames"

    assert await unless_stale(answered(), lambda: False, 0.01) == "frames"


async def test_an_answer_that_came_is_taken_even_when_stale_by_then():
    """Only a request still waiting is given up: an answer is applied or refused by the
    term checks that follow, as before."""
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    done.set_result("frames")
    assert await unless_stale(done, lambda: True, 0.01) == "frames"
