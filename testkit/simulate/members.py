"""One member of the simulated replica set: the server's own role loop (``RoleLoop``,
with its Lease writes), shipper (``Shipper``), read freshness (``Freshness``),
read fence and write fence, on simulated storage, over the simulated network.

What is the simulation's own is the glue the real ``replication/replica_set.py`` and
``role_switch.py`` hold (primary or standby mode as the role loop's state
changes, with the same steps in the same order), the follow loop of a standby
(``standby.py``), and how a write or a read reaches the member. A crash cancels
every task of the member at once and drops what its storage had not flushed;
a restart builds every object anew from what the storage kept, as a process
start does. Each member runs on its own machine (``clock.Host``): its clock,
which every deadline of its code reads and which may drift, and its process,
which a pause stops (SIGSTOP) and resumes (SIGCONT) with everything as it was.
A crash of a paused member (kill -9 of a stopped process) resumes it first, so
that its tasks unwind.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stream_server.replication.fences.read_fence import ReadFence
from stream_server.replication.fences.write_fence import WriteFence
from stream_server.replication.lease.roles import RoleConfig, RoleLoop
from stream_server.replication.primary.shipping import Shipper
from stream_server.replication.standby.freshness import Freshness
from testkit.history import message
from testkit.simulate.clock import PROCESS, START, Host, Process
from testkit.simulate.lease import SimLeaseClient
from testkit.simulate.standby import Standby
from testkit.simulate.storage import Hooks, Storage

if TYPE_CHECKING:
    from testkit.simulate.world import World


@dataclass(frozen=True)
class Settings:
    """The replication settings, scaled down from the defaults (15 s Lease, 10 s renew
    deadline, 2 s retry period, 5 s wait and staleness bound) in the same proportions."""

    lease_duration: float = 3.0
    renew_deadline: float = 2.0
    retry_period: float = 0.5
    replication_wait: float = 1.2
    replication_read_staleness: float = 1.2
    replication_durability: str = "required"
    size: int = 3
    replica_url: str = ""

    @property
    def quorum(self) -> int:
        return self.size // 2 + 1


class _NoSwitchover:
    """The write fence asks whether a switchover holds writes: none is simulated."""

    switching = False


def url(name: str) -> str:
    return f"sim://{name}"


def owned_task(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    context: contextvars.Context | None = None,
) -> asyncio.Task[Any]:
    """The loop's task factory: a task, recorded with the process whose code created it.
    Every task is created in its creator's context, so each task the server's code
    starts (the role loop's, the shipper's joins, a wait_for's) belongs to the process
    that started it, and dies with it (``Process.kill``)."""
    task = asyncio.Task(coro, loop=loop, context=context)
    process = PROCESS.get() if context is None else context.get(PROCESS)
    if process is not None:
        process.adopt(task)
    return task


class Member:
    def __init__(self, name: str, world: World) -> None:
        self.name = name
        self.world = world
        self.settings = Settings(replica_url=url(name))
        self.storage = Storage()
        # A machine's clock reading has nothing to do with another's: each starts apart.
        self.host = Host(world.loop, START + world.rng.uniform(0.0, 1000.0))
        self.process = Process(self.host)  # none started yet
        self.up = False
        self.incarnation = 0
        self.primary = False  # primary mode (``RoleSwitch.primary``)
        self.term = 0  # the term this member writes under (``ReplicaHooks.term``)
        self.published = 0  # the last lsn readers here may see

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """A process start on what the storage holds (``replica_set.py``'s wiring)."""
        s, w = self.settings, self.world
        self.incarnation += 1
        self.up = True
        self.process = Process(self.host)
        self.roles = RoleLoop(
            SimLeaseClient(w.lease, w.net, self.name, w.reorder),  # type: ignore[arg-type]
            RoleConfig(
                self.name, url(self.name), s.lease_duration, s.renew_deadline, s.retry_period
            ),
            position=lambda: self.storage.durable,
            clock=self.host.now,
            reported=lambda: self.shipper.positions(),
            term_floor=lambda: self.storage.term_floor,
        )
        self.shipper = Shipper(
            self.roles,
            Hooks(self.storage),  # type: ignore[arg-type]
            quorum=s.quorum,
            preferred=False,
            wait=s.replication_wait,
            renew_deadline=s.renew_deadline,
            ring_bytes=1 << 40,
        )
        for frame in self.storage.frames[: self.storage.flushed]:
            self.shipper.add(*frame)  # recovery hands the WAL's frames to the shipper
        self.freshness = Freshness(s.replication_read_staleness, clock=self.host.now_ns)
        self.read_fence = ReadFence(
            s, self.roles, self.freshness, lambda: self.primary, lambda: self.shipper.settled
        )
        self.writes = WriteFence(s, self.roles, s.quorum, self, _NoSwitchover())  # type: ignore[arg-type]
        self.primary, self.term = False, 0
        self.published = self.storage.lsn  # a store shows all it recovered
        self.writer = asyncio.Lock()
        self.gated: list[asyncio.Task[bool]] = []  # batches at the ack gate
        self.standby = Standby(self)
        self._context = contextvars.copy_context()
        self._context.run(PROCESS.set, self.process)
        self._context.run(self.roles.start)
        self._context.run(self.shipper.start)
        self.spawn(self._switch())
        self.spawn(self.standby.run())

    def stop(self, *, crash: bool) -> None:
        """The process dies (``Process.kill``), paused or not; a crash also loses what the
        storage had not flushed."""
        if not self.up:
            return
        self.up = False
        self.world.abandoned.update(self.process.kill())
        if crash:
            self.storage.crash()
        self.world.trace(f"{'crash' if crash else 'stop'} {self.name} at {self.storage.durable}")

    def pause(self, seconds: float) -> None:
        """SIGSTOP now, SIGCONT ``seconds`` of true time later, unless it crashed meanwhile."""
        process = self.process
        if not self.up or process.paused:
            return
        process.pause()
        self.world.trace(f"pause {self.name} for {seconds:.3f} s")

        def resume() -> None:
            if process.paused:  # else it died, or the faults healed, meanwhile
                process.resume()
                self.world.trace(f"resume {self.name}")

        self.world.loop.call_true(seconds, resume)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task of this process, whoever asks (a request arriving runs in no process's
        context), that dies with it; what it raises is a failure of the run, as
        ``World.guard`` makes it for the simulation's own tasks."""
        task = self.world.loop.create_task(coro, context=self._context)
        task.add_done_callback(self.world.failed, context=contextvars.Context())
        return task

    # -------------------------------------------------- primary or standby

    async def _switch(self) -> None:
        """``RoleSwitch.run``: standby first, then the mode the role loop's state names."""
        await self._to_standby()
        while True:
            changed = self.roles.state.changed
            if self.roles.is_primary and not self.primary:
                await self._to_primary()
            elif not self.roles.is_primary and self.primary:
                await self._to_standby()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.settings.retry_period)

    async def _to_primary(self) -> None:
        """``RoleSwitch._to_primary``, step for step."""
        self.standby.following = False
        async with self.standby.applying:
            pass
        self.published = self.storage.lsn
        self.term = term = self.roles.state.term
        known = max(self.standby.commit, self.shipper.confirmed)
        unsettled = bool(self.roles.state.eligible) and self.storage.lsn > known
        self.shipper.became_primary(term, unsettled=unsettled, known=known)
        self.primary = True
        self.world.seen_primary(self.name, term, self.storage.lsn)

    async def _to_standby(self) -> None:
        """``RoleSwitch._to_standby``: no new batch, the gated ones drained (the
        pipeline's ``drained``), then readers see what was published, held until a
        commit point covers it."""
        self.primary = False
        self.shipper.close_streams()
        self.shipper.changed.notify()  # the gated batches look again (role_switch.py)
        async with self.writer:  # the batch being written, if any, is at the gate
            while self.gated:
                await asyncio.wait(list(self.gated))
        self.freshness.hold(self.published)
        self.standby.following = True

    # ------------------------------------------------------ client requests

    async def write(self, token: str) -> tuple[str, int | None]:
        """An append: the write fence, the batch made durable and shipped, then the
        ack gate (``Shipper.wait``) within the replication wait. ("fail": refused
        before anything was written; "info": written, not acknowledged.)"""
        if await self.writes.refusal() is not None:
            return "fail", None
        async with self.writer:
            if not (self.primary and self.roles.may_acknowledge):
                return "fail", None  # the engine is not writable: nothing written
            term, lsn, frame = self.term, len(self.storage.frames) + 1, message(token)
            self.storage.write([(term, lsn, frame)])
            await self.storage.flush(self.world.flush_delay())
            self.shipper.add(term, lsn, frame)  # ``ReplicaHooks.on_frame``, once durable
        gate = self.spawn(self._gate(lsn))
        self.gated.append(gate)
        try:
            passed = await asyncio.wait_for(asyncio.shield(gate), self.settings.replication_wait)
        except TimeoutError:
            return "info", None  # the pipeline's ``_overdue``: the batch stays gated
        if not passed:
            return "info", None
        self.world.acknowledged(self, lsn)
        return "ok", self.term

    async def _gate(self, lsn: int) -> bool:
        """The batch at the ack gate (``Shipper.wait``) until the commit point reaches it
        (then it is published) or this member may no longer acknowledge."""
        try:
            passed = await self.shipper.wait(lsn, lambda _: None)
        finally:
            self.gated = [g for g in self.gated if not g.done() and g is not asyncio.current_task()]
        if passed:
            self.published = max(self.published, lsn)
        return passed

    def read(self) -> bytes | None:
        """A catch-up read of the whole stream if the read fence lets it be answered as up
        to date, else None (a 503). Whether a primary answered: ``self.primary``."""
        if self.primary:  # batches are published once the gate passed them
            self.published = max(self.published, min(self.shipper.committed, self.storage.lsn))
        if self.read_fence.fresh_for() <= 0:
            return None
        return self.storage.content(self.published)
