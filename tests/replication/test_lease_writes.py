"""Lease writes whose outcome is not known at once, and who stays electable.

Against the emulated API server (409 on a stale resourceVersion, as
kube-apiserver): a change of the in-sync set whose answer was lost is read
back before the primary acts on it; a join in flight already holds the commit
point back; "preferred" durability never acknowledges without an in-sync
member; standbys removed while nothing could be acknowledged without them
stay eligible, and a primary without a quorum hands the Lease to them.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from stream_server.engine.replica import ReplicaHooks
from stream_server.replication.fences.read_fence import ReadFence
from stream_server.replication.lease.kube_lease import (
    LeaseClient,
    LeaseConflict,
    LeaseRecord,
    LeaseUnavailable,
)
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.primary.shipping import Shipper
from stream_server.replication.standby.freshness import Freshness
from testkit import wait_until
from tests.replication.role_loops import DURATION, Clock, replica, seed


class LosingClient(LeaseClient):
    """Loses the answer of the next replace: after it was written (``landed``), or
    with the request itself held back, to be delivered later (``late``)."""

    def __init__(self, inner: LeaseClient) -> None:
        self.__dict__.update(inner.__dict__)
        self.lose: str | None = None  # "landed" or "late"
        self.late: LeaseRecord | None = None
        self.hold: asyncio.Event | None = None  # a replace waits for it when set

    async def replace(self, record: LeaseRecord) -> LeaseRecord:
        if self.hold is not None:
            await self.hold.wait()
        lose, self.lose = self.lose, None
        if lose == "late":
            self.late = replace(record)
            raise _lost()
        written = await super().replace(record)
        if lose == "landed":
            raise _lost()
        return written


def _lost() -> LeaseUnavailable:
    return LeaseUnavailable("PUT .../leases/x: ReadTimeout('answer lost')")


def losing(loop: RoleLoop) -> LosingClient:
    client = LosingClient(loop.client)
    loop.client = client
    return client


async def test_a_join_whose_answer_was_lost_but_that_landed_counts(api, lease) -> None:
    a = replica(api, lease, "a", Clock())
    await a.step()
    client = losing(a)
    client.lose = "landed"
    assert await a.change_in_sync(["b"])  # read back: it is in the Lease
    assert a.state.in_sync == ["b"]
    assert (await client.get()).in_sync == ["b"]  # type: ignore[union-attr]


async def test_a_write_that_was_lost_on_the_way_can_never_land_later(api, lease) -> None:
    a = replica(api, lease, "a", Clock())
    await a.step()
    client = losing(a)
    client.lose = "late"
    assert not await a.change_in_sync(["b"])
    assert a.state.in_sync == []
    # The request arrives after all, against the version it was written for: the
    # read-back renewed at that version, so it can only be refused.
    assert client.late is not None
    with pytest.raises(LeaseConflict):
        await LeaseClient.replace(client, client.late)
    assert (await client.get()).in_sync == []  # type: ignore[union-attr]


async def test_a_join_in_flight_already_holds_the_commit_point(api, lease) -> None:
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.change_in_sync(["b"])
    hooks = ReplicaHooks()
    shipper = Shipper(a, hooks, quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    shipper.became_primary(a.state.term)
    for lsn in (1, 2, 3):
        shipper.add(a.state.term, lsn, b"frame")
    shipper.note("b", a.state.term, 3)
    assert shipper.commit_point() == 3
    client = losing(a)
    client.hold = asyncio.Event()
    shipper.note("c", a.state.term, 3)  # caught up: its join is being written
    await asyncio.sleep(0)
    for lsn in (4, 5):
        shipper.add(a.state.term, lsn, b"frame")
    shipper.note("b", a.state.term, 5)
    # c may be in the Lease already (electable) though it holds only up to 3.
    assert shipper.commit_point() == 3
    client.hold.set()
    await wait_until(lambda: "c" in a.state.in_sync)
    shipper.note("c", a.state.term, 5)
    assert shipper.commit_point() == 5


async def test_preferred_durability_still_waits_for_every_in_sync_standby(api, lease) -> None:
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.change_in_sync(["b"])
    shipper = Shipper(a, ReplicaHooks(), quorum=3, preferred=True, wait=5.0, renew_deadline=10.0)
    shipper.became_primary(a.state.term)
    for lsn in (1, 2, 3):
        shipper.add(a.state.term, lsn, b"frame")
    shipper.note("b", a.state.term, 1)
    # Two of three in sync, fewer than required: "preferred" may acknowledge without
    # the quorum, but b may be elected, so never past what b holds.
    assert shipper.commit_point() == 1
    await a.change_in_sync([])  # b removed by CAS: now the primary is alone
    assert shipper.commit_point() == 3


async def test_standbys_removed_below_the_quorum_stay_eligible(api, lease) -> None:
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.change_in_sync(["b", "c"])
    shipper = Shipper(a, ReplicaHooks(), quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    assert shipper._eligible_after(["b"]) == []  # still a quorum: c may fall behind
    await a.change_in_sync(["b"], shipper._eligible_after(["b"]))
    assert shipper._eligible_after([]) == ["b"]  # nothing is acknowledged without b now
    await a.change_in_sync([], ["b"])
    assert (await a.client.get()).eligible == ["b"]  # type: ignore[union-attr]
    preferred = Shipper(a, ReplicaHooks(), quorum=2, preferred=True, wait=5.0, renew_deadline=10.0)
    assert preferred._eligible_after([]) == []  # it acknowledges alone: b falls behind


async def test_an_eligible_standby_takes_over_and_the_others_stay_eligible(api, lease) -> None:
    await seed(api, lease, holder="a", term=3, in_sync=[], eligible=["b", "c"])
    clock = Clock()
    b, d = replica(api, lease, "b", clock), replica(api, lease, "d", clock)
    await b.step()
    await d.step()
    clock.now += DURATION
    await d.step()  # neither in sync nor eligible: may lack acknowledged writes
    assert d.state.role == "standby"
    await b.step()
    assert (b.state.role, b.state.term) == ("primary", 4)
    # Until this term has a quorum nothing is acknowledged: a and c still hold all
    # that was, and one of them may take over if b dies first.
    assert b.record.eligible == ["a", "c"]  # type: ignore[union-attr]


async def test_a_primary_without_a_quorum_gives_the_lease_to_an_eligible_one(api, lease) -> None:
    clock = Clock()
    a, b = replica(api, lease, "a", clock), replica(api, lease, "b", clock)
    await a.step()
    await a.change_in_sync([], ["b"])
    await b.step()
    await a.give_up("cut off from its standbys")
    assert not a.is_primary
    await b.step()  # given up: no need to wait for the Lease to run out
    assert (b.state.role, b.state.term) == ("primary", 2)
    assert b.record.eligible == ["a"]  # type: ignore[union-attr]
    clock.now += 1.0
    await a.step()
    assert (a.state.role, a.state.primary_url) == ("standby", "http://b:4437")


async def test_having_given_up_the_primary_lets_the_others_go_first(api, lease) -> None:
    clock = Clock()
    a = replica(api, lease, "a", clock)
    await a.step()
    await a.change_in_sync([], ["b"])
    await a.give_up("cut off from its standbys")
    await a.step()
    assert a.state.role == "standby"  # b may take it for a lease duration
    clock.now += DURATION
    await a.step()  # nobody did: a takes it back (it holds every acknowledged write)
    assert (a.state.role, a.state.term) == ("primary", 2)


async def test_a_primary_learns_of_a_new_holder_from_the_watch_not_its_clock(api, lease) -> None:
    """A primary whose clock barely moves (here: not at all) and whose next round is
    far off still steps down as soon as another replica writes the Lease."""
    a = replica(api, lease, "a", Clock())
    a.config.retry_period = 1000.0
    a.start()
    try:
        await wait_until(lambda: a.is_primary)
        client = LeaseClient(lease, api.url)
        try:
            record = await client.get()
            assert record is not None
            await client.replace(replace(record, holder="b", term=record.term + 1))
        finally:
            await client.close()
        for _ in range(1000):  # 10 s of real time at most
            if not a.is_primary:
                break
            await asyncio.sleep(0.01)
        assert (a.state.role, a.state.holder) == ("standby", "b")
    finally:
        await a.stop()


async def test_a_peer_following_a_newer_term_deposes_the_primary_at_once(api, lease) -> None:
    """Cut off from the API with a slow clock, a deposed primary hears of the new term
    from a standby whose stream ended; it steps down without waiting for a deadline."""
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.deposed(a.state.term, "http://b:4437")  # the same term: nothing newer
    assert a.is_primary
    await a.deposed(a.state.term + 1, "http://b:4437")
    assert (a.state.role, a.state.term, a.state.primary_url) == ("standby", 2, "http://b:4437")
    assert a.demoted == [1]  # type: ignore[attr-defined]


async def below_the_quorum(shipper: Shipper, now: float) -> None:
    """The in-sync watch's rounds over one renew deadline below the quorum."""
    await shipper._give_up_without_quorum(now)
    await shipper._give_up_without_quorum(now + shipper.renew_deadline)


async def test_a_primary_back_after_another_held_the_lease_gives_it_up_again(api, lease) -> None:
    """Cut from its standbys but not the API: it gives the Lease up, b takes it and gives
    it up too (its standby was re-copying), a takes it back and must hand it round
    again, not hold it for as long as the cut lasts (a fault run stalled so)."""
    clock = Clock()
    a, b = replica(api, lease, "a", clock), replica(api, lease, "b", clock)
    await a.step()
    await a.change_in_sync([], ["b"])
    await b.step()
    shipper = Shipper(a, ReplicaHooks(), quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    shipper.became_primary(a.state.term)
    await below_the_quorum(shipper, 0.0)
    assert not a.is_primary
    await b.step()
    assert (b.state.role, b.state.term) == ("primary", 2)
    await b.give_up("its standby is re-copying")
    clock.now += DURATION
    await a.step()
    assert (a.state.role, a.state.term) == ("primary", 3)
    shipper.became_primary(a.state.term)
    await below_the_quorum(shipper, 100.0)
    assert not a.is_primary
    assert (await a.client.get()).holder == ""  # type: ignore[union-attr]


async def test_a_primary_nobody_relieved_keeps_the_lease_the_second_time(api, lease) -> None:
    """The standbys are down, not cut off: nobody took the Lease, so the primary that
    took it back waits for them as primary instead of handing it round."""
    clock = Clock()
    a = replica(api, lease, "a", clock)
    await a.step()
    await a.change_in_sync([], ["b"])
    shipper = Shipper(a, ReplicaHooks(), quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    shipper.became_primary(a.state.term)
    await below_the_quorum(shipper, 0.0)
    assert not a.is_primary
    clock.now += DURATION
    await a.step()
    assert (a.state.role, a.state.term) == ("primary", 2)
    shipper.became_primary(a.state.term)
    await below_the_quorum(shipper, 100.0)
    assert a.is_primary


async def test_a_primary_that_took_over_an_unconfirmed_tail_serves_reads_once_a_quorum_holds_it(
    api, lease
) -> None:
    """Frames past the last commit point it heard of, while another replica is eligible:
    its readers wait (503) until this term has a quorum in sync, for until then a
    primary elected after it without them would roll them back."""
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.change_in_sync([], ["b"])
    shipper = Shipper(a, ReplicaHooks(), quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    settings = SimpleNamespace(replication_read_staleness=5.0, replica_url="http://a:4437")
    fence = ReadFence(settings, a, Freshness(5.0), lambda: True, lambda: shipper.settled)
    shipper.became_primary(a.state.term, unsettled=True)
    refusal = fence.read_refusal()
    assert refusal is not None and refusal[0] == 503
    assert b"no quorum has confirmed" in refusal[2]
    assert fence.fresh_for() == 0
    await a.change_in_sync(["b"])  # b joined: it holds everything a held
    assert fence.read_refusal() is None and fence.fresh_for() > 0
    await a.change_in_sync([], ["b"])  # settled for the rest of the term
    assert fence.read_refusal() is None
    shipper.became_primary(a.state.term + 1)  # nothing unconfirmed taken over
    assert fence.read_refusal() is None
    preferred = Shipper(a, ReplicaHooks(), quorum=2, preferred=True, wait=5.0, renew_deadline=10.0)
    preferred.became_primary(a.state.term, unsettled=True)  # acknowledges alone anyway
    assert preferred.settled


async def test_what_a_primary_knows_is_confirmed_is_not_what_it_took_over(api, lease) -> None:
    """A primary's commit point starts at all it holds; what it may call settled next
    time (``confirmed``) is only what a quorum confirmed, so a second take-over of
    the same unconfirmed tail is as unsettled as the first."""
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.change_in_sync(["b"])
    shipper = Shipper(a, ReplicaHooks(), quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    shipper.became_primary(a.state.term)
    for lsn in (1, 2, 3, 4, 5):
        shipper.add(a.state.term, lsn, b"frame")
    shipper.note("b", a.state.term, 3)
    assert shipper.commit_point() == 3 and shipper.confirmed == 3
    await a.change_in_sync([], ["b"])
    shipper.became_primary(a.state.term + 1, unsettled=True)
    assert shipper.commit_point() == 5  # its own history from here
    assert shipper.confirmed == 3  # but only 3 was ever confirmed


async def test_a_new_primary_a_standby_fetches_from_keeps_the_lease(api, lease) -> None:
    """Below the quorum, but a standby is in touch (catching up after a re-copy): not cut
    off, so it does not hand the Lease round while that standby chases it."""
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.change_in_sync([], ["b"])
    shipper = Shipper(a, ReplicaHooks(), quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    shipper.became_primary(a.state.term)
    shipper.add(a.state.term, 1, b"frame")
    shipper.note("b", a.state.term, 0)  # fetching, one frame behind
    now = shipper.seen["b"]
    for t in (0.0, 4.0, 8.0, 12.0):  # it fetches every 4 s, past the renew deadline
        shipper.seen["b"] = now + t
        await shipper._give_up_without_quorum(now + t)
    assert a.is_primary
    await below_the_quorum(shipper, now + 100.0)  # silent since: cut off after all
    assert not a.is_primary


async def test_a_give_up_whose_write_was_lost_is_written_again(api, lease) -> None:
    """The give-up's CAS lost (a 409 or no answer): the next round writes it again, for a
    standby that reported less than the old primary holds would wait a lease duration
    more than it, and the old primary, cut off, would take the Lease back first."""
    clock = Clock()
    a, b = replica(api, lease, "a", clock), replica(api, lease, "b", clock)
    await a.step()
    await a.change_in_sync([], ["b"])
    await b.step()
    losing(a).lose = "late"
    await a.give_up("cut off from its standbys")
    assert not a.is_primary
    assert (await a.client.get()).holder == "a"  # type: ignore[union-attr]
    clock.now += 1.0
    await a.step()
    assert (await a.client.get()).holder == ""  # type: ignore[union-attr]
    await b.step()
    assert (b.state.role, b.state.term) == ("primary", 2)


async def test_an_unsettled_primary_tells_standbys_only_what_it_knew_was_committed(
    api, lease
) -> None:
    """Until its term has a quorum in sync, a primary that took over a tail past the last
    commit point it knew announces no more than that point, and its answers make no
    standby's reads current: a standby would publish, and a re-copied one trust, a
    commit point covering writes a later election can roll back."""
    a = replica(api, lease, "a", Clock())
    await a.step()
    await a.change_in_sync([], ["b"])
    shipper = Shipper(a, ReplicaHooks(), quorum=2, preferred=False, wait=5.0, renew_deadline=10.0)
    for lsn in (1, 2, 3, 4, 5):
        shipper.add(a.state.term, lsn, b"frame")
    shipper.became_primary(a.state.term, unsettled=True, known=3)
    assert shipper.commit_point() == 5  # every acknowledged write is at or below it
    assert shipper.announced() == 3  # but only 3 is known to survive any election
    assert shipper.vouching and not shipper.echoing
    await a.change_in_sync(["b"])  # b joined: it holds everything a held
    assert shipper.announced() == 5 and shipper.echoing
    shipper.became_primary(a.state.term + 1, known=0)  # settled from the start
    assert shipper.settled and shipper.announced() == 5
