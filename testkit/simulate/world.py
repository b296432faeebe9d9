"""One simulated run's world: the clock, the random generator, the network, the
Lease, the members, the clients' history and the trace.

Every random choice comes from one ``random.Random(seed)`` drawn in the order the
single-threaded loop runs, so a seed replays exactly; the trace (the events
that matter, with their virtual times) and its digest show that it did.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from stream_server.replication.lease.kube_lease import LeaseRecord
from stream_server.replication.peers.wire import Shipped
from stream_server.replication.primary.shipping import COMMIT_LINGER, MAX_ANSWER, Refusal, Shipper
from testkit.history import History, Seen
from testkit.simulate.clock import VirtualLoop
from testkit.simulate.lease import LeaseServer
from testkit.simulate.links import Network, Reply
from testkit.simulate.members import Member, owned_task

PEER_TIMEOUT = 3.0  # seconds a standby's request waits (the follower's 15 s, scaled)
# One round of a stream, as the standby hears it: the primary's term, the frames, the
# commit point announced and the echo.
Round = tuple[int, list[Shipped], int, int]
NAMES = ("ds-0", "ds-1", "ds-2")


class World:
    def __init__(self, seed: int, loop: VirtualLoop, *, reorder: bool = True) -> None:
        self.seed = seed
        self.reorder = reorder  # Lease answers may overtake each other (lease.py)
        self.loop = loop
        loop.set_task_factory(owned_task)
        self.rng = random.Random(seed)
        self.net = Network(self.rng, loop)
        self.lease = LeaseServer(self.trace, self.lease_written)
        self.history = History()
        self.events: list[str] = []
        self.errors: list[str] = []  # exceptions the simulation's own tasks raised
        self.broken: list[str] = []  # invariants seen broken while the run went on
        self.abandoned: set[asyncio.Task[Any]] = set()  # of processes that died: never done
        self._lease_term = 0  # the highest term a Lease write has named
        self.members = {name: Member(name, self) for name in NAMES}

    def trace(self, event: str) -> None:
        self.events.append(f"{self.loop.now:.6f} {event}")  # true time, whoever traces

    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.events).encode()).hexdigest()[:16]

    def flush_delay(self) -> float:
        """An fdatasync's time: mostly milliseconds, now and then a stall."""
        if self.rng.random() < 0.05:
            return self.rng.uniform(0.05, 0.3)
        return self.rng.uniform(0.0005, 0.02)

    async def guard(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """A task's coroutine; what it raises (a bug of the simulation or of the code
        under test, not a fault it injected) is a violation of the run."""
        try:
            return await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            self.errors.append(traceback.format_exc(limit=6))
            return None

    def failed(self, task: asyncio.Task[Any]) -> None:
        """A member's task ended: what it raised is a failure of the run (``guard``)."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.errors.append("".join(traceback.format_exception(exc, limit=6)))

    def seen_primary(self, name: str, term: int, lsn: int) -> None:
        """A member took up primary mode: the history's monitor sees it at once."""
        now = self.loop.now
        self.history.seen.append(Seen(name, now, now, "primary", term))
        self.trace(f"primary {name} term {term} lsn {lsn}")

    def lease_written(self, record: LeaseRecord) -> None:
        """A Lease write landed. One that names a holder under a new term must find no
        other member still allowed to acknowledge by its own clock: the leader-lease
        argument (roles.py: a primary stops ``lease_duration - lease_renew_deadline``
        before anyone may take over, for clocks whose rates differ by less than their
        ratio). The set's fencing by term keeps writes safe without it, so a breach
        would otherwise show only as a stale read that happened to come in time."""
        if not record.holder or record.term <= self._lease_term or len(self.broken) >= 10:
            return
        self._lease_term = record.term
        for member in self.members.values():
            if member.name != record.holder and member.up and member.roles.may_acknowledge:
                self.broken.append(
                    f"{record.holder} took the Lease under term {record.term} while "
                    f"{member.name} (term {member.roles.state.term}) could still acknowledge "
                    f"for {member.roles.acknowledge_for:.3f} s by its clock"
                )

    def acknowledged(self, member: Member, lsn: int) -> None:
        """``member`` acknowledges its frame ``lsn``: the design's promise (shipping.py) is
        that every replica the Lease makes electable, in the in-sync set or eligible,
        holds it durably at this moment, so that no election can lose it. Checked
        against the Lease as the API server holds it and the members' disks."""
        record, frame = self.lease.record, member.storage.frames[lsn - 1]
        if record is None or len(self.broken) >= 10:
            return
        for name in sorted({*record.in_sync, *record.eligible} - {member.name}):
            disk = self.members[name].storage
            if disk.flushed < lsn or disk.frames[lsn - 1] != frame:
                self.broken.append(
                    f"{member.name} acknowledged lsn {lsn} (term {frame[0]}) while {name}, "
                    f"electable (Lease v{record.version}), held only {disk.durable} durably"
                )

    # ------------------------------------------------------------ requests

    def request(
        self, src: str, dst: str, serve: Callable[[Member], Coroutine[Any, Any, object]]
    ) -> asyncio.Future[object]:
        """A request to the member ``dst``, served by a task of its incarnation (a crash
        cancels it: no answer)."""
        target = self.members[dst]

        def arrive(reply: Reply) -> None:
            if target.up:
                target.spawn(_answer(serve, target, reply))

        return self.net.request(src, dst, arrive)

    async def stream_round(
        self, member: Member, primary: str, params: tuple[int, int, int, int], stamp: int
    ) -> Round | Refusal:
        """One round of a standby's stream (``sender.py``) as one request and its answer
        over the simulated network: the position it names is its acknowledgement,
        and the answer is what the primary's shipper would push next, with the echo
        of ``stamp`` (``_round``)."""
        name = member.name

        async def serve(target: Member) -> object:
            return await _round(target.shipper, name, params, stamp)

        answer = await asyncio.wait_for(
            self.request(name, primary.removeprefix("sim://"), serve), PEER_TIMEOUT
        )
        assert isinstance(answer, (tuple, Refusal))
        return answer

    async def recopy(self, member: Member, primary: str) -> None:
        """The standby copies the primary's data directory and starts again on it."""

        async def serve(target: Member) -> object:
            return list(target.storage.frames[: target.storage.flushed])

        try:
            frames = await asyncio.wait_for(
                self.request(member.name, primary.removeprefix("sim://"), serve), PEER_TIMEOUT
            )
        except TimeoutError:
            return
        assert isinstance(frames, list)
        self.trace(f"recopy {member.name} from {primary}: {len(frames)} frames")
        self.loop.call_soon(self._restart_on, member, frames)

    def _restart_on(self, member: Member, frames: list[tuple[int, int, bytes]]) -> None:
        member.stop(crash=False)
        member.storage.replace(frames)
        member.start()


async def _answer(
    serve: Callable[[Member], Coroutine[Any, Any, object]], target: Member, reply: Reply
) -> None:
    reply(await serve(target))


async def _round(
    shipper: Shipper, name: str, params: tuple[int, int, int, int], stamp: int
) -> Round | Refusal:
    """What a primary's stream sends a standby at ``params`` (term, durable term and
    lsn, commit point known), as ``Sender`` sends it: refused as a stream request is
    (``Shipper.refusal``), else the position counted (``Shipper.note``) and the
    frames after it, up to ``MAX_ANSWER`` bytes, with the commit point announced and
    the echo only while the primary is ``echoing``. With no frame to send it waits,
    as a stream does, for one: a heartbeat's time at most, and ``COMMIT_LINGER``
    once the commit point has moved (sent alone then)."""
    term, after_term, after_lsn, known = params
    refused = shipper.refusal(term, after_term, after_lsn)
    if refused is not None:
        return refused
    shipper.note(name, after_term, after_lsn)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(1.0, shipper.silent_after / 2)
    while shipper.lsn <= after_lsn and shipper.roles.is_primary and not shipper.stopping:
        if (announced := shipper.announced()) > known:
            deadline = min(deadline, loop.time() + COMMIT_LINGER)
            known = announced
        left = deadline - loop.time()
        if left <= 0:
            break
        await shipper.changed.wait(left)
    frames: list[Shipped] = []
    size = 0
    for shipped in shipper.ring.since(shipper.ring.first_after(after_lsn)):
        if frames and size + len(shipped[2]) > MAX_ANSWER:
            break
        frames.append(shipped)
        size += len(shipped[2])
    shipper.shipped += len(frames)
    echo = stamp if shipper.echoing else 0
    return shipper.roles.state.term, frames, shipper.announced(), echo
