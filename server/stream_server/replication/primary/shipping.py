"""The primary's side of log shipping: the recent frames, the refusals, the
in-sync set and the ack gate. Kept whole although long: they are one object's
state (``Shipper``), changed together on one event loop.

A standby follows by a stream (``sender.py``: frames pushed, its durable
position sent back as each is flushed); the position is also its
acknowledgement of every frame up to it, as a Kafka follower's fetch
position is, and is counted here (``note``). The commit point is the highest
lsn durable here and on every in-sync standby; the ack gate lets a batch's
waiters hear of it only once the commit point reaches it and the in-sync set
with the primary is at least ``min_in_sync`` replicas.

The in-sync set changes only by a CAS on the Lease (``RoleLoop.change_in_sync``).
A standby joins once its position reaches the commit point; from the moment
its join is written (or its outcome unknown) the commit point waits for it
too, and it counts towards ``min_in_sync`` only once the write succeeded (as
Kafka's leader computes the high watermark over the "maximal ISR", KIP-497).
A standby not heard from for half the renew deadline is removed by a CAS, and
until that write succeeded nothing is acknowledged without it (it is still
in the set the gate uses). "preferred" durability acknowledges without the
quorum, never without an in-sync member: every replica that may be elected
holds every acknowledged write, whatever the durability.

Removed while too few were in sync (durability "required"), a standby stays
``eligible`` (KIP-966's eligible leader replicas): nothing could be
acknowledged without it. A primary left below the quorum for a renew
deadline while another replica is eligible gives the Lease up
(``RoleLoop.give_up``), so that standbys cut off from it but not from each
other can elect one of themselves and go on.

Frames are kept in memory (``ring_bytes``, oldest dropped first): a follower
further behind is told to re-copy (docs/replication.md, first version). A
stream finds its first frame by bisection, so its cost does not grow with
the frames held.

When only the commit point moved, a stream waits up to ``COMMIT_LINGER`` for
a frame to carry it along before sending it alone: under load the next batch
comes within that time, and the standby then answers one message per batch
instead of two. The cost is that an idle standby's readers see the last
write up to that much later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stream_server.engine.replica import NotReplicated, ReplicaHooks
from stream_server.engine.storage_errors import StorageError
from stream_server.replication import rules
from stream_server.replication.lease import boottime
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.primary.frame_ring import RING_BYTES, FrameRing
from stream_server.replication.primary.signal import Signal

log = logging.getLogger("stream_server.replication")

MAX_ANSWER = 4 * 1024 * 1024  # bytes of frames a stream sends unacknowledged (one at least)
COMMIT_LINGER = 0.025  # seconds a commit point waits for a frame to carry it (module doc)


class StandbyStream(Protocol):
    """A standby's open stream as the shipper drives it (``sender.Sender``): a protocol,
    so that the shipper does not import the module built on it."""

    def push(self) -> None:
        """Send the frames the stream has not sent yet."""
        ...

    def send_commit(self) -> float | None:
        """Send the commit point alone if due; else the seconds until it is, or None."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a standby may not follow or copy us: an HTTP answer, as the endpoint sends it."""

    status: int
    headers: dict[str, str]
    body: bytes


class Shipper:
    def __init__(
        self,
        roles: RoleLoop,
        hooks: ReplicaHooks,
        *,
        quorum: int,
        preferred: bool,
        wait: float,
        renew_deadline: float,
        ring_bytes: int = RING_BYTES,
        on_stream_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.roles = roles
        self.hooks = hooks
        self.quorum = quorum
        self.preferred = preferred
        self.wait_seconds = wait
        self.renew_deadline = renew_deadline
        self.silent_after = renew_deadline / 2
        # Behind this long: out of the set. Just short of the wait a write is refused after:
        # a slow standby costs latency, and only one that would cost refusals is dropped.
        self.lag_max = max(self.silent_after, 0.8 * wait)
        self.ring = FrameRing()
        self.ring_bytes = ring_bytes
        self.acked: dict[str, tuple[int, int]] = {}  # name -> (term, lsn) it last acknowledged
        self.seen: dict[str, float] = {}  # name -> our clock when it last spoke
        self.caught_up_at: dict[str, float] = {}  # name -> when it last held all we did
        # name -> (our lsn, our clock) when it last gave its position
        self._asked: dict[str, tuple[int, float]] = {}
        self.committed = 0
        self.shipped = 0  # frames sent, for metrics
        self.stopping = False
        self.changed = Signal()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._joining: set[str] = set()  # join written, not yet confirmed: waited for
        self._short_since: float | None = None  # our clock since too few were in sync
        self._gave_up = False  # gave the Lease up in this spell below the quorum
        self._gave_up_in = 0  # the term we gave the Lease up in
        self._settled = True  # ``settled``, latched once true in a term
        self._took_over_at = 0  # our lsn when we last became primary
        self._known = 0  # the last commit point we knew of then (``announced``)
        # The highest lsn no election can roll back, as far as we know: a commit point
        # of ours while settled (a primary's ``committed`` starts at all it holds).
        self.confirmed = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._term = 0
        self.senders: set[StandbyStream] = set()  # the standbys' open streams (``sender.py``)
        # Told the name of a standby whose stream of our term ended (``stream_lost``).
        self.on_stream_lost = on_stream_lost
        self._linger: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._watch(), name="replication in-sync watch")

    async def stop(self) -> None:
        self.stopping = True
        self._notify()
        self.close_streams()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def became_primary(self, term: int, *, unsettled: bool = False, known: int = 0) -> None:
        """A new term: every follower's position is learnt again from its stream.
        ``unsettled``: we hold frames past ``known``, the last commit point we heard of,
        while another replica could still be elected without them (``settled``)."""
        self._term = term
        self._took_over_at = self.lsn
        self._known = known
        self._settled = self.preferred or not unsettled
        if self._settled:
            self.confirmed = max(self.confirmed, self.lsn)
        self.acked.clear()
        self.seen.clear()
        self.caught_up_at.clear()
        self._asked.clear()
        self._short_since = None
        if term > self._gave_up_in + 1:
            # Another replica held the Lease since we gave it up, so the others are
            # alive: if they cannot reach us either, hand it round again. (A primary
            # cut from its standbys retook it while one re-copied and the other
            # waited out its own give-up, and held it for as long as the cut lasted.)
            self._gave_up = False
        # Everything we hold counts as committed from here (it includes every write
        # acknowledged so far): a standby joins the in-sync set only once it holds
        # all of it, so no acknowledged write can be missing on a later candidate.
        self.committed = self.lsn
        self.close_streams()  # of an older term, if any were left
        self._notify()

    # -------------------------------------------------------------- frames

    def on_frame(self, term: int, lsn: int, frame: bytes) -> None:
        """From the writer thread, once a batch is durable here (``ReplicaHooks.on_frame``,
        given by the service); only after ``start``: a replica writes nothing of its
        own before it is primary."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._add, term, lsn, frame)

    def add(self, term: int, lsn: int, frame: bytes) -> None:
        """A frame this replica holds durably (written, or applied as a standby): kept
        so that it can ship it once primary."""
        self._add(term, lsn, frame)

    def _add(self, term: int, lsn: int, frame: bytes) -> None:
        self.ring.append((term, lsn, frame))
        while self.ring.size > self.ring_bytes and len(self.ring) > 1:
            self.ring.popleft()
        self._notify()
        for sender in list(self.senders):
            sender.push()

    def lag_bytes(self, name: str) -> int:
        """WAL bytes held here that the standby ``name`` has not confirmed."""
        return self.ring.bytes_after(self._acked_lsn(name))

    @property
    def lsn(self) -> int:
        """Our durable lsn as the event loop knows it."""
        return self.ring[-1][1] if self.ring else self.hooks.durable[1]

    def commit_point(self) -> int:
        """The highest lsn on us and every in-sync standby (monotone)."""
        if not self.roles.is_primary:
            return self.committed
        in_sync = self.roles.state.in_sync
        if 1 + len(in_sync) >= self.quorum or self.preferred:
            # Every member, confirmed or joining: a join whose write is in flight or
            # unknown may already be in the Lease, making that standby electable.
            members = [self._acked_lsn(n) for group in (in_sync, self._joining) for n in group]
            point = rules.commit_point(self.lsn, members)
        else:
            point = self.committed
        self.committed = max(self.committed, point)
        if self.settled:
            self.confirmed = max(self.confirmed, self.committed)
        return self.committed

    @property
    def settled(self) -> bool:
        """Whether every frame we hold is one no later election can roll back: always,
        unless we took over holding frames past the last commit point we heard of
        while others were eligible (they may lack them); then from the moment this
        term first has a quorum in sync (a standby joins only once it holds all we
        held). Until then a reader here could see a write that a primary elected
        after us, without it, never had: Raft commits an entry of its own term
        first for this reason. Our readers wait for it (``read_fence.py``)."""
        if not self._settled and 1 + len(self.roles.state.in_sync) >= self.quorum:
            self._settled = True
            self.confirmed = max(self.confirmed, self._took_over_at)
        return self._settled

    def announced(self) -> int:
        """The commit point our standbys are told: ours once settled; until then no more
        than the last one we knew of when we took over. Past it we hold a tail that a
        later election may roll back, and a standby publishes to its readers what the
        commit point covers, a re-copied or restarted one holds its reads until it
        covers all it holds (``freshness.py``), and one promoted later counts on it."""
        point = self.commit_point()
        return point if self.settled else min(point, self._known)

    @property
    def echoing(self) -> bool:
        """Whether our answers may make a standby's reads current (``freshness.py``): we
        vouch for our commit point and it is settled. Until then the writes a primary
        before us acknowledged may lie past what we announce (``announced``), so a
        standby's readers could miss them; ours are refused meanwhile too."""
        return self.vouching and self.settled

    @property
    def vouching(self) -> bool:
        """Whether our commit point covers every write acknowledged so far, by us or a
        primary before us: we took up the Lease's term (``became_primary`` set the
        commit point to all we held) and renewed within the renew deadline, so no other
        primary can exist. Only then may an answer of ours make a standby's reads
        current (``freshness.py``)."""
        return self._term == self.roles.state.term and self.roles.may_acknowledge

    def _acked_lsn(self, name: str) -> int:
        return self.acked.get(name, (0, 0))[1]

    # ------------------------------------------------------------- the gate

    async def wait(self, lsn: int, late: Callable[[StorageError], None]) -> bool:
        """Until the commit point reaches ``lsn`` (True) or this replica may no longer
        acknowledge in the term it took up (False: deposed, or the Lease taken back
        under a newer term that ``became_primary`` has not taken up yet: the commit
        point of the old one can then never reach the batch, and the role switch
        waits for the batch to leave). The pipeline times each batch's waiters out
        on its own (``overdue``), so a batch queued behind a held one gets its
        answer in time."""
        while True:
            if self.stopping or not self.vouching:
                late(NotReplicated("not acknowledged: this replica is no longer the primary"))
                return False
            if self.commit_point() >= lsn:
                return True
            await self.changed.wait(1.0)

    def overdue(self) -> StorageError:
        have = 1 + len(self.roles.state.in_sync)
        return NotReplicated(
            f"not acknowledged: {have} replicas in sync of the {self.quorum} "
            "required have not all confirmed this write; retry"
        )

    def _notify(self) -> None:
        self.changed.notify()

    async def acknowledged(self, name: str, lsn: int) -> None:
        """Until the standby ``name`` has confirmed ``lsn`` (a switchover's target
        catching up): woken by each position that moves (``note``)."""
        while self._acked_lsn(name) < lsn:
            await self.changed.wait(1.0)

    def handed_over(self) -> None:
        """The Lease went to another replica (a switchover): wake whoever waits on us
        now and end the standbys' streams, so that each hears the new term."""
        self._notify()
        self.close_streams()

    # ------------------------------------------------------------- standbys

    def refusal(self, term: int, after_term: int, after_lsn: int) -> Refusal | None:
        """Why a standby at this position cannot follow us by frames (409), or None."""
        state = self.roles.state
        if not self.roles.is_primary or term != state.term:
            return _json(
                409, {"error": "wrong term", "term": state.term, "primary": state.primary_url}
            )
        mine = self.lsn
        end = self.hooks.term_end(after_term, mine)
        if after_lsn and (after_lsn > mine or end is None or after_lsn > end):
            # Frames we never had: written by a deposed primary, never acknowledged. Where
            # its history and ours part (null: its term was never ours, so nowhere we
            # can name); for people reading it, the standby re-copies either way.
            return _json(409, {"error": "diverged", "term": state.term, "truncate_to": end})
        first = self.ring[0][1] if self.ring else mine + 1
        if after_lsn < mine and first > after_lsn + 1:
            return _json(409, {"error": "too far behind: re-copy", "term": state.term})
        return None

    def note(self, name: str, after_term: int, after_lsn: int) -> None:
        """A standby's durable position, from its stream request or acknowledgement:
        what it holds, when it last spoke, whether it keeps up, and whether it joins
        the in-sync set."""
        mine = self.lsn
        now = boottime.now()
        moved = self.acked.get(name) != (after_term, after_lsn)
        self.acked[name] = (after_term, after_lsn)
        self.seen[name] = now
        # Kafka's rule for replica.lag.time.max.ms: caught up now if it holds all we
        # do, else caught up as of its previous acknowledgement if it holds all we had
        # then (a standby that keeps pace under load is never "behind" for long).
        asked = self._asked.get(name)
        if after_lsn >= mine:
            self.caught_up_at[name] = now
        elif asked is not None and after_lsn >= asked[0]:
            self.caught_up_at[name] = max(self.caught_up_at.get(name, 0.0), asked[1])
        self._asked[name] = (mine, now)
        if moved:
            self._notify()  # the commit point may move
            if self.senders and self._linger is None:
                # Streams learn a moved commit point with their next frame, or alone
                # if none comes within the linger (one timer for all of them).
                self._linger = asyncio.get_running_loop().call_later(
                    COMMIT_LINGER, self._send_commits
                )
        # Caught up = holds everything committed (Kafka: the follower's log end reached
        # the high watermark). From the CAS on, every further batch waits for it too.
        caught_up = after_lsn >= mine or after_lsn >= self.commit_point()
        state = self.roles.state
        if name not in state.in_sync and caught_up and name not in self._joining:
            self._joining.add(name)
            task = asyncio.create_task(self._join(name), name=f"ISR join {name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _send_commits(self) -> None:
        self._linger = None
        later = [d for s in list(self.senders) if (d := s.send_commit()) is not None]
        if later:  # a frame went there meanwhile: its linger runs from that frame
            self._linger = asyncio.get_running_loop().call_later(min(later), self._send_commits)

    def stream_lost(self, name: str, term: int) -> None:
        """A standby's stream of our current term ended while we are primary: perhaps
        it follows a newer primary. ``on_stream_lost`` asks it (``replica_set.py``), so
        that a primary whose clock runs slow, cut off from the API, learns it was
        deposed from its standbys instead of at a deadline its clock stretches."""
        if (
            self.on_stream_lost is not None
            and not self.stopping
            and self.roles.is_primary
            and term == self.roles.state.term
        ):
            self.on_stream_lost(name)

    def close_streams(self) -> None:
        """End every standby's stream (we step down, or hand over): each asks again
        and hears the new term."""
        for sender in list(self.senders):
            sender.close()

    async def _join(self, name: str) -> None:
        try:
            names = sorted({*self.roles.state.in_sync, name})
            if await self.roles.change_in_sync(names, self._eligible_after(names)):
                log.info("%s is in sync (in-sync set now %s)", name, names)
                self._notify()
        finally:
            self._joining.discard(name)

    async def _watch(self) -> None:
        """Remove silent standbys from the in-sync set, by CAS, before acknowledging
        anything without them."""
        while True:
            await asyncio.sleep(self.silent_after / 4)
            if not self.roles.is_primary:
                continue
            now = boottime.now()
            in_sync = self.roles.state.in_sync
            silent = [n for n in in_sync if now - self.seen.get(n, 0.0) > self.silent_after]
            # Kafka's replica.lag.time.max.ms: a standby that acknowledges but does not keep up
            # (its disk full, its storage failed closed) would hold every write until the
            # replication wait refuses it; it leaves the set well before that.
            behind = [
                n
                for n in in_sync
                if n not in silent and now - self.caught_up_at.setdefault(n, now) > self.lag_max
            ]
            if silent or behind:
                keep = [n for n in in_sync if n not in silent and n not in behind]
                if await self.roles.change_in_sync(keep, self._eligible_after(keep)):
                    log.warning(
                        "removed %s from the in-sync set: silent for %.1fs; %s: behind for %.1fs",
                        silent,
                        self.silent_after,
                        behind,
                        self.lag_max,
                    )
                    self._notify()
            await self._give_up_without_quorum(now)

    def _eligible_after(self, in_sync: list[str]) -> list[str]:
        """The eligible set once ``in_sync`` is the in-sync set: empty while a quorum is
        in sync (writes are acknowledged without the others from then on) and in
        "preferred" durability (it acknowledges alone); otherwise every replica
        that was in sync or eligible keeps holding every acknowledged write."""
        if self.preferred or 1 + len(in_sync) >= self.quorum:
            return []
        state = self.roles.state
        return sorted({*state.in_sync, *state.eligible} - set(in_sync))

    async def _give_up_without_quorum(self, now: float) -> None:
        """Once per spell below the quorum: if nobody else took the Lease (the
        standbys are down, not cut off), this replica takes it back after a lease
        duration and waits for them as primary instead of handing it round. If
        another did take it, the spell begins again when this one is back."""
        state = self.roles.state
        if self.preferred or 1 + len(state.in_sync) >= self.quorum:
            self._short_since = None
            self._gave_up = False
            return
        if self._gave_up or not state.eligible:
            return
        if any(now - seen <= self.silent_after for seen in self.seen.values()):
            # A standby follows us and is catching up (after a re-copy, say): we
            # are not cut off from it. A new primary that gave up then would hand the
            # Lease to one that is, and back, while the standby chases both.
            self._short_since = None
            return
        if self._short_since is None:
            self._short_since = now
        elif now - self._short_since >= self.renew_deadline:
            self._short_since = None
            self._gave_up, self._gave_up_in = True, self._term
            await self.roles.give_up(
                f"{1 + len(state.in_sync)} of the {self.quorum} replicas required in sync "
                f"for {self.renew_deadline:.1f}s, while {state.eligible} may take over"
            )

    def positions(self) -> dict[str, tuple[int, int]]:
        return dict(self.acked)


def _json(status: int, body: dict[str, object]) -> Refusal:
    return Refusal(status, {"content-type": "application/json"}, json.dumps(body).encode())
