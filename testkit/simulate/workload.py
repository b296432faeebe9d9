"""What happens to the simulated replica set: clients that append and read, and the
faults (crashes and restarts, partitions, lost messages, paused processes, clocks
that drift) thrown at it.

Clients are Jepsen's processes: one operation at a time, each recorded in the
history when invoked and when its answer came (virtual times), ``info`` when
none came. A writer sends to the member it last heard was primary (a refusal
or an acknowledgement names it), else to any. Faults come at random intervals while the run's fault
phase lasts; then every cut heals, every member is started, and the set has
a quiet spell to converge before the oracle judges the history.

A pause is SIGSTOP then SIGCONT (``Member.pause``): shorter than the staleness
bound, between it and the lease, or longer than the lease. A clock drifts within
the bound the Lease assumes (docs/replication.md, "The assumption": the rates of
two clocks differ by less than ``lease_duration / lease_renew_deadline``): every
rate is within ``SLOWEST`` and ``FASTEST``, whose ratio is just under it. A drift
past it is not a fault the set promises to survive, and is not thrown.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

from testkit.history import Outcome
from testkit.simulate.lease import API
from testkit.simulate.members import Settings
from testkit.simulate.world import NAMES, World

CLIENT_TIMEOUT = 4.0  # seconds: past the write fence's wait, a flush and two slow messages
CLIENTS = 3
# Clients that only read, at any member: while every writer waits on a primary that can no
# longer acknowledge (a replication wait), reads still come, as a real set's readers do.
READERS = 1
PRIMARY = "answered by a primary"  # a read's detail: the oracle holds it to no staleness
READ_RATIO = 0.3
# Each fault and how often it comes, relative to the others.
FAULTS = {
    "crash": 3,  # any member, restarted 0.05 to 4 s later
    "crash-primary": 2,
    "crash-all": 1,  # a power cut: every member at once, the primary back last
    "cut-peer": 2,  # two members, both ways or one
    "cut-api": 1,  # a member from the Kubernetes API
    "cut-api-primary": 2,  # the primary's Lease calls lost while it acknowledges
    "isolate": 1,  # a member from everyone
    "flaky-api-primary": 2,  # 30 to 70 % of the primary's Lease calls or answers lost
    "split": 2,  # the members and the API split into two sides
    "loss": 1,  # 5 to 30 % of all messages for a while
    "pause": 2,  # any member's process stopped (SIGSTOP) for a while, then resumed
    "pause-primary": 2,
    "clock-drift": 2,  # a member's clock runs at another rate from now on, within the bound
    "clock-drift-primary": 2,  # the bound's worst case: the primary's slowest, the others fastest
}
_SETTINGS = Settings()
# The rates a clock may run at: the ratio of any two just under the one the Lease assumes.
_RATIO = 0.98 * _SETTINGS.lease_duration / _SETTINGS.renew_deadline
SLOWEST, FASTEST = _RATIO**-0.5, _RATIO**0.5
# Seconds a pause lasts: within the staleness bound, past it within the lease, past the lease.
_PAUSES = (
    (0.05, _SETTINGS.replication_read_staleness),
    (_SETTINGS.replication_read_staleness, _SETTINGS.lease_duration),
    (_SETTINGS.lease_duration, 3 * _SETTINGS.lease_duration),
)


class Client:
    def __init__(self, world: World, name: str, read_ratio: float = READ_RATIO) -> None:
        self.world = world
        self.name = name
        self.read_ratio = read_ratio
        self.primary = ""  # where this client last heard the primary is
        self.counter = itertools.count()

    async def run(self, until: float) -> None:
        rng = self.world.rng
        while self.world.loop.time() < until:
            await asyncio.sleep(rng.uniform(0.005, 0.08))
            if rng.random() < self.read_ratio:
                await self._read(rng.choice(NAMES))
            else:
                await self._append(self.primary or rng.choice(NAMES))

    async def _ask(self, server: str, serve: object) -> object:
        try:
            return await asyncio.wait_for(
                self.world.request(self.name, server, serve),  # type: ignore[arg-type]
                CLIENT_TIMEOUT,
            )
        except TimeoutError:
            return None

    async def _append(self, server: str) -> None:
        w = self.world
        token = f"{self.name}.{next(self.counter)}"
        op = w.history.invoke(self.name, "append", "s", token=token, server=server)
        op.invoked = w.loop.time()

        async def serve(member: object) -> object:
            outcome = await member.write(token)  # type: ignore[attr-defined]
            return outcome, member.roles.state.primary_url  # type: ignore[attr-defined]

        answer = await self._ask(server, serve)
        outcome: Outcome = "info"
        if isinstance(answer, tuple):
            (outcome, op.term), hint = answer
            # A write left unacknowledged says its server may not be the primary any more,
            # whatever it believes: the next goes anywhere (a deposed primary that still
            # thinks it leads would otherwise keep every client to itself).
            self.primary = hint.removeprefix("sim://") if hint and outcome != "info" else ""
        else:
            self.primary = ""
        w.history.complete(op, outcome, detail=f"term {op.term}")
        op.completed = w.loop.time()
        w.trace(f"{self.name} append {token} at {server}: {outcome} term {op.term}")

    async def _read(self, server: str) -> None:
        w = self.world
        op = w.history.invoke(self.name, "read", "s", server=server)
        op.invoked = sent = w.loop.time()

        async def serve(member: object) -> object:
            return member.read(), member.primary  # type: ignore[attr-defined]

        answer = await self._ask(server, serve)
        value, primary = answer if isinstance(answer, tuple) else (None, False)
        if isinstance(value, bytes):
            op.fresh_at = sent  # answered up to date: as of when the request was sent
            w.history.complete(op, "ok", detail=PRIMARY if primary else "", value=value)
        else:
            w.history.complete(op, "fail", detail="503 or no answer")
        op.completed = w.loop.time()
        w.trace(f"{self.name} read at {server}: {len(value) if isinstance(value, bytes) else '-'}")


class Faults:
    """Random faults for a while (module doc).

    Swarm testing (Groce et al.): each seed draws its own mix, some kinds left out,
    some three times as frequent, and its own pace, so that the combinations a bug
    needs (a primary cut from the API just as a standby falls silent, say) come up
    in some seeds far more often than one fixed mix would make them."""

    def __init__(self, world: World, without: Iterable[str] = ()) -> None:
        """``without``: kinds never thrown (to see what a mutant needs to be caught)."""
        self.world = world
        rng = world.rng
        left_out = set(without)
        if unknown := left_out - set(FAULTS):
            raise ValueError(f"no fault {sorted(unknown)}; the faults are {', '.join(FAULTS)}")
        kinds = {kind: w for kind, w in FAULTS.items() if kind not in left_out}
        self.weights = {kind: w * rng.choice((0, 1, 1, 3)) for kind, w in kinds.items()}
        if not any(self.weights.values()):
            self.weights = kinds
        self.mean_gap = rng.choice((0.7, 1.0, 2.0))  # seconds between two faults

    async def run(self, until: float) -> None:
        w, rng = self.world, self.world.rng
        while True:
            await asyncio.sleep(rng.expovariate(1 / self.mean_gap))
            now = w.loop.time()
            if now >= until:
                return
            kind = rng.choices(list(self.weights), list(self.weights.values()))[0]
            w.trace(f"fault {kind}")
            getattr(self, kind.replace("-", "_"))(now)

    def _down_for(self) -> float:
        return self.world.rng.uniform(0.05, 4.0)

    def _restart(self, name: str) -> None:
        member = self.world.members[name]
        if not member.up:
            member.start()
            self.world.trace(f"restart {name} at {member.storage.durable}")

    def crash(self, now: float) -> None:
        self._crash(self.world.rng.choice(NAMES))

    def crash_primary(self, now: float) -> None:
        self._crash(self._primary())

    def crash_all(self, now: float) -> None:
        """A power cut. The primary's machine comes back last, past a Lease duration
        after the others: one of them is elected on what its own disk kept."""
        rng = self.world.rng
        for name in NAMES:
            late = self.world.members[name].primary
            self._crash(name, rng.uniform(3.5, 8.0) if late else rng.uniform(0.05, 1.5))

    def _crash(self, name: str, down: float | None = None) -> None:
        member = self.world.members[name]
        if member.up:
            member.stop(crash=True)
            self.world.loop.call_later(down or self._down_for(), self._restart, name)

    def cut_peer(self, now: float) -> None:
        a, b = self.world.rng.sample(NAMES, 2)
        self.world.net.cut(a, b, now + self._down_for(), both=self.world.rng.random() < 0.7)

    def cut_api(self, now: float) -> None:
        name = self.world.rng.choice(NAMES)
        self.world.net.cut(name, API, now + self._down_for(), both=self.world.rng.random() < 0.7)

    def cut_api_primary(self, now: float) -> None:
        """The primary's Lease writes lost (its answers too, mostly): its renewals and
        in-sync changes fail or hang while it still acknowledges."""
        primaries = [n for n in NAMES if self.world.members[n].primary]
        name = primaries[0] if primaries else self.world.rng.choice(NAMES)
        self.world.net.cut(name, API, now + self._down_for(), both=self.world.rng.random() < 0.5)

    def flaky_api_primary(self, now: float) -> None:
        """Some Lease writes of the primary land and some do not, and of either kind some
        answers are lost: what it believes of the in-sync set is only as good as its
        read-back, while its renewals mostly get through."""
        primaries = [n for n in NAMES if self.world.members[n].primary]
        name = primaries[0] if primaries else self.world.rng.choice(NAMES)
        until = now + self.world.rng.uniform(2.0, 8.0)
        self.world.net.flaky(name, API, self.world.rng.uniform(0.3, 0.7), until)

    def isolate(self, now: float) -> None:
        name = self.world.rng.choice(NAMES)
        until = now + self._down_for()
        for other in (*NAMES, API):
            if other != name:
                self.world.net.cut(name, other, until)

    def split(self, now: float) -> None:
        nodes = [*NAMES, API]
        rng = self.world.rng
        side = set(rng.sample(nodes, rng.randint(1, len(nodes) - 1)))
        until = now + self._down_for()
        for a in side:
            for b in nodes:
                if b not in side:
                    self.world.net.cut(a, b, until)

    def loss(self, now: float) -> None:
        net = self.world.net
        net.loss = self.world.rng.uniform(0.05, 0.3)
        self.world.loop.call_later(self._down_for(), setattr, net, "loss", 0.0)

    def _primary(self) -> str:
        primaries = [n for n in NAMES if self.world.members[n].primary]
        return primaries[0] if primaries else self.world.rng.choice(NAMES)

    def pause(self, now: float) -> None:
        self._pause(self.world.rng.choice(NAMES))

    def pause_primary(self, now: float) -> None:
        """The primary stops: a new one is elected if it outlasts the lease, and it
        wakes to the requests that waited for it, its timers all due at once."""
        self._pause(self._primary())

    def _pause(self, name: str) -> None:
        low, high = self.world.rng.choice(_PAUSES)
        self.world.members[name].pause(self.world.rng.uniform(low, high))

    def clock_drift(self, now: float) -> None:
        rng = self.world.rng
        name = rng.choice(NAMES)
        self._drift(name, rng.choice((SLOWEST, FASTEST, rng.uniform(SLOWEST, FASTEST))))

    def clock_drift_primary(self, now: float) -> None:
        """The primary's renew deadline as long and the others' lease as short as the
        bound allows: the margin between them is all that keeps it from acknowledging
        or answering reads once another may have taken over."""
        primary = self._primary()
        for name in NAMES:
            self._drift(name, SLOWEST if name == primary else FASTEST)

    def _drift(self, name: str, rate: float) -> None:
        self.world.members[name].host.set_rate(rate)
        self.world.trace(f"clock of {name} at {rate:.3f} x")

    def heal(self) -> None:
        """Every cut healed, every pause ended and every member started: the run's quiet
        spell begins (the clocks keep their rates: within the bound, they are no fault
        to heal)."""
        self.world.net.heal()
        for name in NAMES:
            member = self.world.members[name]
            if member.process.paused:
                member.process.resume()
                self.world.trace(f"resume {name}")
            self._restart(name)
        self.world.trace("healed")
