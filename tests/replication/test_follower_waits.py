"""A standby's stream request is given up once the Lease names another primary or term.

A request to a primary that is paused or cut off never gets its answer; the standby
would wait out ``STREAM_TIMEOUT`` (15 s) before following the primary the Lease now
names, and a new primary needs its standbys in sync before it acknowledges anything
(an open stream's own watch ends its read in a retry period). ``unless_stale`` gives the
request up as soon as it is no longer wanted, and only then.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from stream_server.engine.replica import ReplicaHooks
from stream_server.replication.standby import receiver as follower_module
from stream_server.replication.standby.receiver import Follower, unless_stale


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


async def test_a_stream_to_a_silent_primary_is_given_up_when_the_lease_moves(monkeypatch):
    """A primary whose packets are dropped accepts nothing, or (here) answers nothing:
    the stream's opening is given up once the Lease names another primary, not after
    STREAM_TIMEOUT, so the standby follows the new primary in time to join it."""
    monkeypatch.setattr(follower_module, "STREAM_TIMEOUT", 3600.0)
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state = SimpleNamespace(term=3, primary_url=f"http://127.0.0.1:{port}")
    roles = SimpleNamespace(state=state, config=SimpleNamespace(name="b", url="http://b:4437"))
    follower = Follower(roles, None, ReplicaHooks(), None, None, retry_period=0.05)  # type: ignore[arg-type]
    follower.following = True
    opening = asyncio.create_task(follower._stream(state.primary_url, 3))
    while not held:  # connected; the upgrade's answer never comes
        assert not opening.done(), opening.result()
        await asyncio.sleep(0.01)
    assert not opening.done()
    state.term, state.primary_url = 4, "http://127.0.0.1:1"  # the Lease moved on
    await asyncio.wait_for(opening, 60)  # a liveness bound: without the check, an hour
    server.close()
    for writer in held:
        writer.close()
