"""One seed's run: the world built on a virtual loop, the workload and faults played,
the faults healed, a quiet spell, then the oracle.

The replication modules' loggers are silenced for the run (a fault-heavy run
logs thousands of warnings); the process clock the shipper reads
(``boottime.now``) is the virtual one while it lasts: the clock of the member
whose code reads it (``VirtualLoop.time``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from stream_server.replication.lease import boottime
from testkit.simulate import mutants, oracle
from testkit.simulate.clock import VirtualLoop
from testkit.simulate.members import Settings
from testkit.simulate.workload import CLIENTS, READERS, Client, Faults
from testkit.simulate.world import World

FAULTS_FOR = 20.0  # seconds of virtual time with faults
QUIET = 12.0  # seconds after: four Lease durations to elect, catch up and settle
CLIENTS_FOR = QUIET / 2  # clients stop this long into the quiet spell, so all answers come


@dataclass
class Result:
    seed: int
    mutant: str | None
    violations: list[str] = field(default_factory=list)
    digest: str = ""  # of the trace: equal for two runs of one seed
    trace: list[str] = field(default_factory=list, repr=False)
    acknowledged: int = 0

    @property
    def events(self) -> int:
        return len(self.trace)


@contextlib.contextmanager
def _virtual(loop: VirtualLoop) -> Iterator[None]:
    quiet = logging.getLogger("stream_server")
    level, now = quiet.level, boottime.now
    quiet.setLevel(logging.CRITICAL + 1)
    boottime.now = loop.time  # type: ignore[assignment]
    try:
        yield
    finally:
        boottime.now = now  # type: ignore[assignment]
        quiet.setLevel(level)


async def _scenario(world: World, without: Iterable[str]) -> None:
    start = world.loop.time()
    for member in world.members.values():
        member.start()
    faults = Faults(world, without)
    clients = [Client(world, f"c{i}") for i in range(CLIENTS)]
    clients += [Client(world, f"r{i}", read_ratio=1.0) for i in range(READERS)]
    until = start + FAULTS_FOR
    tasks = [asyncio.ensure_future(world.guard(c.run(until + CLIENTS_FOR))) for c in clients]
    await faults.run(until)
    faults.heal()
    await asyncio.sleep(until + QUIET - world.loop.time())
    await asyncio.gather(*tasks)


def run_seed(
    seed: int, mutant: str | None = None, *, reorder: bool = True, without: Iterable[str] = ()
) -> Result:
    """Play ``seed`` (with ``mutant``'s broken rule, if named) and judge it; ``reorder``:
    a member's Lease answers may overtake each other, as the real client's do (replication/lease/kube_lease.py).
    Seeds found with answers in order replay with ``reorder=False``. ``without``: fault
    kinds left out (``workload.FAULTS``), to see which ones a mutant needs."""
    loop = VirtualLoop()
    world = World(seed, loop, reorder=reorder)
    # A task of the server's own code that dies of an exception nobody awaits (a shipper's
    # join, say) is a failure of the run, not a line on stderr.
    loop.set_exception_handler(lambda _, context: world.errors.append(str(context)))
    with mutants.applied(mutant), _virtual(loop):
        try:
            loop.run_until_complete(_scenario(world, without))
        finally:
            _end(loop, world)
        gc.collect()  # a dead task reports its unretrieved exception when it is collected
        found = oracle.violations(world, Settings().replication_read_staleness)
    acked = sum(1 for op in world.history.ops if op.kind == "append" and op.outcome == "ok")
    return Result(seed, mutant, found, world.digest(), world.events, acked)


def _end(loop: VirtualLoop, world: World) -> None:
    """Every member's process dies, the rest (the clients, the faults) is cancelled and
    unwinds, then the loop closes."""
    for member in world.members.values():
        world.abandoned.update(member.process.kill())
    pending = asyncio.all_tasks(loop) - world.abandoned
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
