"""One seed's run: the world built on a virtual loop, the workload and faults played,
the faults healed, a quiet spell, then the oracle.

The replication modules' loggers are silenced for the run (a fault-heavy run
logs thousands of warnings); the process clock the shipper reads
(``boottime.now``) is the virtual one while it lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from stream_server.replication.lease import boottime
from testkit.simulate import mutants, oracle
from testkit.simulate.clock import VirtualLoop
from testkit.simulate.members import Settings
from testkit.simulate.workload import CLIENTS, Client, Faults
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


async def _scenario(world: World) -> None:
    start = world.loop.time()
    for member in world.members.values():
        member.start()
    faults = Faults(world)
    clients = [Client(world, f"c{i}") for i in range(CLIENTS)]
    until = start + FAULTS_FOR
    tasks = [asyncio.ensure_future(world.guard(c.run(until + CLIENTS_FOR))) for c in clients]
    await faults.run(until)
    faults.heal()
    await asyncio.sleep(until + QUIET - world.loop.time())
    await asyncio.gather(*tasks)


def run_seed(seed: int, mutant: str | None = None, *, reorder: bool = True) -> Result:
    """Play ``seed`` (with ``mutant``'s broken rule, if named) and judge it; ``reorder``:
    a member's Lease answers may overtake each other, as the real client's do (replication/lease/kube_lease.py).
    Seeds found with answers in order replay with ``reorder=False``."""
    loop = VirtualLoop()
    world = World(seed, loop, reorder=reorder)
    # A task of the server's own code that dies of an exception nobody awaits (a shipper's
    # join, say) is a failure of the run, not a line on stderr.
    loop.set_exception_handler(lambda _, context: world.errors.append(str(context)))
    with mutants.applied(mutant), _virtual(loop):
        try:
            loop.run_until_complete(_scenario(world))
        finally:
            _end(loop)
        gc.collect()  # a dead task reports its unretrieved exception when it is collected
        found = oracle.violations(world, Settings().replication_read_staleness)
    acked = sum(1 for op in world.history.ops if op.kind == "append" and op.outcome == "ok")
    return Result(seed, mutant, found, world.digest(), world.events, acked)


def _end(loop: VirtualLoop) -> None:
    """Cancel what still runs (every member's tasks) and let it unwind, then close."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
