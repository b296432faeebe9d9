"""The role loop against the emulated API server (Leases, 409 on a stale
resourceVersion), with a clock the test moves: who becomes primary, when a
primary steps down, and who may take over."""

from __future__ import annotations

import asyncio

import pytest

from stream_server.replication.lease.kube_lease import LeaseClient, LeaseConflict, LeaseRecord
from tests.replication.role_loops import DURATION, Clock, replica, seed


async def test_first_replica_creates_the_lease_and_the_others_follow(api, lease) -> None:
    clock = Clock()
    a, b = replica(api, lease, "a", clock), replica(api, lease, "b", clock)
    await a.step()
    await b.step()
    assert (a.state.role, a.state.term) == ("primary", 1)
    assert (b.state.role, b.state.term, b.state.primary_url) == ("standby", 1, "http://a:4437")
    ns, name = lease.split("/")
    obj = api.get("Lease", ns, name)
    assert obj["spec"]["holderIdentity"] == "a"
    assert obj["metadata"]["annotations"]["streams.pyds.dev/term"] == "1"
    assert obj["metadata"]["annotations"]["streams.pyds.dev/primary-url"] == "http://a:4437"


async def test_a_stale_write_is_refused_with_a_conflict(api, lease) -> None:
    record = await seed(api, lease, holder="a", term=1)
    client = LeaseClient(lease, api.url)
    try:
        await client.replace(LeaseRecord(**{**record.__dict__, "term": 2}))
        with pytest.raises(LeaseConflict):
            await client.replace(LeaseRecord(**{**record.__dict__, "term": 3}))
        assert (await client.get()).term == 2  # type: ignore[union-attr]
    finally:
        await client.close()


async def test_the_primary_renews_and_nobody_takes_an_unexpired_lease(api, lease) -> None:
    clock = Clock()
    a, b = replica(api, lease, "a", clock), replica(api, lease, "b", clock)
    await a.step()
    await a.change_in_sync(["b"])
    await b.step()
    version = a.record.version
    clock.now += DURATION - 1
    await a.step()
    assert a.record.version != version  # renewed: a new resourceVersion
    clock.now += DURATION - 1  # b saw the renewal change the Lease: not expired for b
    await b.step()
    assert (a.state.role, b.state.role) == ("primary", "standby")
    assert b.state.in_sync == ["b"]


async def test_only_an_in_sync_replica_takes_an_expired_lease_with_a_new_term(api, lease) -> None:
    await seed(
        api, lease, holder="a", term=4, transitions=2, in_sync=["b"], primary_url="http://a:4437"
    )
    clock = Clock()
    b, c = replica(api, lease, "b", clock), replica(api, lease, "c", clock)
    await b.step()
    await c.step()
    clock.now += DURATION
    await c.step()  # expired, but c is not in sync: it may hold less than was acknowledged
    assert c.state.role == "standby"
    await b.step()
    assert (b.state.role, b.state.term) == ("primary", 5)
    assert b.record.in_sync == []
    assert b.record.transitions == 3
    await c.step()
    assert (c.state.term, c.state.primary_url) == (5, "http://b:4437")


async def test_a_paused_primary_steps_down_when_it_sees_the_new_holder(api, lease) -> None:
    clock = Clock()
    a, b = replica(api, lease, "a", clock), replica(api, lease, "b", clock)
    await a.step()
    await a.change_in_sync(["b"])
    await b.step()
    clock.now += DURATION  # a is paused (SIGSTOP): it runs no round
    await b.step()
    assert (b.state.role, b.state.term) == ("primary", 2)
    assert b.record.began == "election"  # taken after the Lease ran out (operator Events)
    assert not a.may_acknowledge  # before its next round: its renew deadline passed
    await a.step()  # a wakes up
    assert (a.state.role, a.state.term, a.state.primary_url) == ("standby", 2, "http://b:4437")
    assert a.demoted == [1]


async def test_a_primary_that_cannot_renew_stops_at_the_renew_deadline(api, lease) -> None:
    clock = Clock()
    a = replica(api, lease, "a", clock)
    await a.step()
    good = a.client.collection
    a.client.collection = "http://127.0.0.1:9/apis"  # nothing listens there
    clock.now += 9.0
    await a.step()
    assert a.state.role == "primary" and a.may_acknowledge and not a.demoted
    clock.now += 1.0
    await a.step()
    assert a.state.role == "standby" and a.demoted == [1]
    a.client.collection = good
    await a.step()  # back in touch and still the holder: primary again, under a new term
    assert (a.state.role, a.state.term) == ("primary", 2)


async def test_concurrent_candidates_elect_exactly_one(api, lease) -> None:
    await seed(api, lease, holder="a", term=1, in_sync=["b", "c"])
    clock = Clock()
    b, c = replica(api, lease, "b", clock), replica(api, lease, "c", clock)
    await asyncio.gather(b.step(), c.step())
    clock.now += DURATION
    await asyncio.gather(b.step(), c.step())
    roles = sorted([b.state.role, c.state.role])
    assert roles == ["primary", "standby"]
    await asyncio.gather(b.step(), c.step())
    assert b.state.term == c.state.term == 2


async def test_at_a_cold_start_the_most_advanced_replica_goes_first(api, lease) -> None:
    await seed(
        api,
        lease,
        holder="a",
        term=3,
        in_sync=["b"],
        positions={"a": (3, 90), "b": (3, 120)},
    )
    clock = Clock()
    a = replica(api, lease, "a", clock, position=(3, 90))
    b = replica(api, lease, "b", clock, position=(3, 120))
    await a.step()  # a restarted: the Lease is its own, but b reported more
    await b.step()
    assert (a.state.role, b.state.role) == ("standby", "standby")
    clock.now += DURATION
    await a.step()
    await b.step()
    assert (a.state.role, b.state.role, b.state.term) == ("standby", "primary", 4)
    await a.step()
    assert (a.state.term, a.state.primary_url) == (4, "http://b:4437")


async def test_the_old_holder_ahead_of_everyone_takes_its_lease_back_at_once(api, lease) -> None:
    await seed(api, lease, holder="a", term=3, in_sync=["b"], positions={"a": (3, 90)})
    clock = Clock()
    a = replica(api, lease, "a", clock, position=(3, 90))
    await a.step()
    assert (a.state.role, a.state.term) == ("primary", 4)


async def test_a_behind_candidate_waits_one_more_lease_duration(api, lease) -> None:
    await seed(
        api, lease, holder="x", term=3, in_sync=["a", "b"], positions={"a": (3, 90), "b": (3, 120)}
    )
    clock = Clock()
    a = replica(api, lease, "a", clock, position=(3, 90))
    await a.step()
    clock.now += DURATION
    await a.step()
    assert a.state.role == "standby"  # b reported more: a gives it one more lease
    clock.now += DURATION
    await a.step()
    assert (a.state.role, a.state.term) == ("primary", 4)  # b did not come: a is safe too


async def test_a_replica_that_lost_its_data_may_not_take_over(api, lease) -> None:
    await seed(api, lease, holder="a", term=2, in_sync=["b"], positions={"b": (2, 50)})
    clock = Clock()
    b = replica(api, lease, "b", clock, position=(0, 0))  # its data directory was wiped
    await b.step()
    clock.now += 3 * DURATION
    await b.step()
    assert b.state.role == "standby"
