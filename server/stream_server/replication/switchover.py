"""A planned change of primary (``POST /replication/switchover``), losing nothing.

A rolling update or a drain of the primary's node would otherwise be a
failover: writes refused for a lease duration, and whatever was in flight
answered 503 with an unknown outcome. Here the primary hands the Lease to an
in-sync standby that provably holds everything it wrote, as Patroni's and
CloudNativePG's switchover do (stop the primary's writes, wait for the
standby to replay all of it, then promote it):

1. **Hold** new writes (``Switchover.switching``: ``WriteFence.refusal`` waits, as
   it does while too few replicas are in sync, and refuses 503 +
   ``Retry-After`` past ``replication_wait``; nothing of such a write is read
   or written).
2. **Drain**: wait until the commit pipeline is idle, so every write admitted
   before the hold is acknowledged (or failed) the ordinary way.
3. **Fence**: stop the work that writes by itself (sweepers, subscriptions),
   then make the engine refuse any batch of its own (``hooks.writable``), and
   drain again: from here this replica writes nothing at all, whatever was
   still on its way (a request admitted just before the hold) fails with 503
   and nothing written.
4. **Catch up**: wait until the target's position (its durable
   position, as its stream acknowledges it) equals our last written lsn.
5. **Hand over**: one CAS on the Lease names the target holder under
   ``term + 1`` with its URL (``RoleLoop.hand_over``) and demotes us. The held
   writes are then answered 503 with ``Stream-Primary: <target>``. The
   target's role loop takes the Lease at that term (``_take_handed_over``)
   and becomes primary by the same path as after an election.

Any failure before the CAS (timeout, the Lease lost) undoes steps 1 and 3:
we stayed primary throughout and nothing was lost. A CAS whose answer was lost
may have happened: we re-read the Lease, and if it cannot be read we step down
without a write (always safe) and let the role loop settle it, so that we
never write under a term the Lease has given to someone else.

Safety: every write acknowledged before the CAS is at or below our last
written lsn, which the target holds durably (step 4); after the fence we
write nothing, so nothing can be acknowledged that the target lacks; and the
term bump fences any late stream message of ours as in a failover.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from stream_server.engine.pipeline import CommitPipeline
from stream_server.engine.replica import ReplicaHooks
from stream_server.replication.lease.kube_lease import LeaseConflict, LeaseRecord, LeaseUnavailable
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.primary.shipping import Shipper

log = logging.getLogger("stream_server.replication")

DEFAULT_TIMEOUT = 10.0  # seconds for the whole switchover when the request names none
MAX_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class SwitchoverResponse:
    """The HTTP response this server sends to ``POST /replication/switchover``."""

    status: int
    body: dict[str, object]
    headers: dict[str, str] = field(default_factory=dict)


def refused(status: int, code: str, message: str, **headers: str) -> SwitchoverResponse:
    return SwitchoverResponse(status, {"error": {"code": code, "message": message}}, headers)


def parse_request(body: bytes) -> tuple[str | None, float] | SwitchoverResponse:
    """``{"to": NAME, "timeout": SECONDS}``, both optional; 400 for anything else."""
    if not body.strip():
        return None, DEFAULT_TIMEOUT
    try:
        asked = json.loads(body)
    except ValueError:
        return refused(400, "BAD_REQUEST", "the body must be a JSON object")
    if not isinstance(asked, dict) or set(asked) - {"to", "timeout"}:
        return refused(400, "BAD_REQUEST", 'the body may hold "to" and "timeout" only')
    to = asked.get("to")
    if to is not None and (not isinstance(to, str) or not to):
        return refused(400, "BAD_REQUEST", '"to" must be a replica name')
    timeout = asked.get("timeout", DEFAULT_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        return refused(400, "BAD_REQUEST", f'"timeout" must be seconds, 0 to {MAX_TIMEOUT:g}')
    return to, float(timeout)


class Switchover:
    """Planned changes of primary on this replica: ``run`` does one at a time.

    Its collaborators come in by the constructor, each for what the steps need: the
    role loop (the Lease), the shipper (the target's position, the standbys'
    streams), the commit pipeline (drained), the replica hooks (fenced), and the
    service's primary work (stopped while fenced). It imports none of the service,
    which holds one and asks it whether writes are held (``switching``)."""

    def __init__(
        self,
        *,
        name: str,
        roles: RoleLoop,
        shipper: Shipper,
        pipeline: CommitPipeline,
        hooks: ReplicaHooks,
        lsn: Callable[[], int],
        peer_urls: Mapping[str, str],
        primary_mode: Callable[[], bool],
        stop_work: Callable[[], Awaitable[None]],
        start_work: Callable[[], Awaitable[None]],
    ) -> None:
        self.name = name
        self.roles = roles
        self.shipper = shipper
        self.pipeline = pipeline
        self.hooks = hooks
        self.lsn = lsn  # the engine's last written lsn
        self.peer_urls = peer_urls  # each follower's origin, as its stream requests give it
        self.primary_mode = primary_mode
        self.stop_work = stop_work
        self.start_work = start_work
        self.switching = False  # new writes are held (``WriteFence.refusal``)
        self._fenced = False  # this switchover stopped the primary work and the writes

    async def run(self, to: str | None, within: float) -> SwitchoverResponse:
        """Hand the Lease to ``to`` (or the most advanced in-sync standby) within
        ``within`` seconds, or stay primary and say why not."""
        roles = self.roles
        if not (self.primary_mode() and roles.may_acknowledge):
            primary = roles.state.primary_url
            headers = {"stream-primary": primary} if primary and not roles.is_primary else {}
            return refused(409, "NOT_PRIMARY", "this replica is not the primary", **headers)
        if self.switching:
            return refused(409, "IN_PROGRESS", "a switchover is already in progress")
        target = self._target(to)
        if isinstance(target, SwitchoverResponse):
            return target
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.switching = True
        self._fenced = False
        try:
            await self._fence_and_catch_up(target, started + within)
            written = await self._hand_over(target)
        except (TimeoutError, LeaseConflict, LeaseUnavailable) as exc:
            await self._resume()
            log.warning("switchover to %s abandoned: %s", target, exc)
            why = (
                f"{target} did not catch up in time" if isinstance(exc, TimeoutError) else str(exc)
            )
            still = "still primary" if roles.is_primary else "no longer primary"
            return SwitchoverResponse(
                503,
                {
                    "error": {
                        "code": "NOT_SWITCHED",
                        "message": f"not switched over: {why}; {still}",
                    }
                },
                {"retry-after": "1"},
            )
        except BaseException:  # cancelled (shutdown): never leave the writes held or fenced
            await self._resume()
            raise
        paused = loop.time() - started
        # End the standbys' streams now, under the new term: the target then reads the
        # Lease at once instead of after its retry period.
        self.shipper.handed_over()
        self.switching = False  # we are a standby now: held writes are refused with the new primary
        roles.notify()
        log.info(
            "switched over to %s (term %d): writes held %.0f ms", target, written.term, paused * 1e3
        )
        return SwitchoverResponse(
            200, {"primary": target, "term": written.term, "paused_ms": round(paused * 1e3, 1)}
        )

    async def _fence_and_catch_up(self, target: str, deadline: float) -> None:
        """Steps 2 to 4: drain, fence, drain again, wait until the target holds our
        last lsn (woken by its acknowledgements); TimeoutError past ``deadline``."""
        async with asyncio.timeout_at(deadline):
            await self.pipeline.drained()
        self._fenced = True
        await self.stop_work()
        self.hooks.writable = False
        async with asyncio.timeout_at(deadline):
            await self.pipeline.drained()
            await self.shipper.acknowledged(target, max(self.lsn(), self.shipper.lsn))

    async def _hand_over(self, target: str) -> LeaseRecord:
        """Step 5: the CAS on the Lease, its outcome settled when its answer was lost."""
        if not (self.primary_mode() and self.roles.may_acknowledge):
            raise LeaseConflict("this replica lost the Lease during the switchover")
        try:
            return await self.roles.hand_over(target, self.peer_urls[target])
        except LeaseUnavailable:
            return await self._settle(target)

    async def _resume(self) -> None:
        """Undo the hold and the fence of a switchover that did not happen."""
        if self._fenced and self.primary_mode() and self.roles.is_primary:
            self.hooks.writable = True
            await self.start_work()
        self._fenced = False
        self.switching = False
        self.roles.notify()  # the held writes go on (or learn that we are no longer primary)

    def _target(self, to: str | None) -> str | SwitchoverResponse:
        """The standby to hand over to: the one named, else the most advanced in sync."""
        in_sync = [n for n in self.roles.state.in_sync if n != self.name]
        if to is None:
            known = [n for n in in_sync if n in self.peer_urls]
            if not known:
                return refused(409, "NO_CANDIDATE", "no standby is in sync")
            return max(known, key=lambda n: self.shipper.acked.get(n, (0, 0)))
        if to == self.name:
            return refused(409, "NOT_IN_SYNC", f"{to} is this replica, the primary already")
        if to not in in_sync:
            return refused(
                409, "NOT_IN_SYNC", f"{to} is not in the in-sync set {in_sync} (or not a replica)"
            )
        if to not in self.peer_urls:
            return refused(409, "NOT_IN_SYNC", f"{to} has not followed this primary yet")
        return to

    async def _settle(self, target: str) -> LeaseRecord:
        """The hand-over CAS got no answer: find out whether it happened."""
        roles = self.roles
        for _ in range(3):
            try:
                record = await roles.client.get()
            except LeaseUnavailable:
                continue
            if record is not None and record.holder == target and record.term > roles.state.term:
                await roles.step_down(record)
                return record
            if (
                record is not None
                and record.holder == self.name
                and record.term == roles.state.term
            ):
                raise LeaseUnavailable("the Lease was not changed")
            break
        await roles.step_down()  # unknown: writing on could be under a term given away
        raise LeaseConflict("the outcome of the hand-over is unknown: stepped down")
