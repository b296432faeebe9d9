"""A planned change of primary (``POST /replication/switchover``), losing nothing.

A rolling update or a drain of the primary's node would otherwise be a
failover: writes refused for a lease duration, and whatever was in flight
answered 503 with an unknown outcome. Here the primary hands the Lease to an
in-sync standby that provably holds everything it wrote, as Patroni's and
CloudNativePG's switchover do (stop the primary's writes, wait for the
standby to replay all of it, then promote it):

1. **Hold** new writes (``Replication.switching``: ``write_refusal`` waits, as
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
4. **Catch up**: wait until the target's fetch position (its durable
   position, as its fetches acknowledge it) equals our last written lsn.
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
term bump fences any late fetch answer of ours as in a failover.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stream_server.replication.lease import LeaseConflict, LeaseRecord, LeaseUnavailable

if TYPE_CHECKING:
    from stream_server.replication.service import Replication

log = logging.getLogger("stream_server.replication")

DEFAULT_TIMEOUT = 10.0  # seconds for the whole switchover when the request names none
MAX_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class SwitchoverAnswer:
    status: int
    body: dict[str, object]
    headers: dict[str, str] = field(default_factory=dict)


def refused(status: int, code: str, message: str, **headers: str) -> SwitchoverAnswer:
    return SwitchoverAnswer(status, {"error": {"code": code, "message": message}}, headers)


def parse_request(body: bytes) -> tuple[str | None, float] | SwitchoverAnswer:
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


async def switch_over(rep: Replication, to: str | None, timeout: float) -> SwitchoverAnswer:
    roles = rep.roles
    if not (rep.primary_mode and roles.may_acknowledge):
        primary = roles.state.primary_url
        headers = {"stream-primary": primary} if primary and not roles.is_primary else {}
        return refused(409, "NOT_PRIMARY", "this replica is not the primary", **headers)
    if rep.switching:
        return refused(409, "IN_PROGRESS", "a switchover is already in progress")
    target = _target(rep, to)
    if isinstance(target, SwitchoverAnswer):
        return target
    url = rep.peer_urls[target]
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    rep.switching = True
    fenced = False
    try:
        await _until(rep, lambda: rep.store.pipeline.idle, deadline)
        fenced = True
        await rep.stop_primary_work()
        rep.hooks.writable = False
        await _until(rep, lambda: rep.store.pipeline.idle, deadline)
        last = max(rep.store.engine.lsn, rep.shipper.lsn)
        await _until(rep, lambda: rep.shipper.acked.get(target, (0, 0))[1] >= last, deadline)
        if not (rep.primary_mode and roles.may_acknowledge):
            raise LeaseConflict("this replica lost the Lease during the switchover")
        try:
            written = await roles.hand_over(target, url)
        except LeaseUnavailable:
            written = await _settle(rep, target)
    except (TimeoutError, LeaseConflict, LeaseUnavailable) as exc:
        await _resume(rep, fenced)
        log.warning("switchover to %s abandoned: %s", target, exc)
        why = f"{target} did not catch up in time" if isinstance(exc, TimeoutError) else str(exc)
        still = "still primary" if roles.is_primary else "no longer primary"
        return SwitchoverAnswer(
            503,
            {"error": {"code": "NOT_SWITCHED", "message": f"not switched over: {why}; {still}"}},
            {"retry-after": "1"},
        )
    except BaseException:  # cancelled (shutdown): never leave the writes held or fenced
        await _resume(rep, fenced)
        raise
    paused = loop.time() - started
    # Answer the standbys' waiting fetches now, and end their streams, under the new
    # term: the target then reads the Lease at once instead of after its retry period.
    rep.shipper._notify()
    rep.shipper.close_streams()
    rep.switching = False  # we are a standby now: held writes are refused with the new primary
    roles.notify()
    log.info(
        "switched over to %s (term %d): writes held %.0f ms", target, written.term, paused * 1e3
    )
    return SwitchoverAnswer(
        200, {"primary": target, "term": written.term, "paused_ms": round(paused * 1e3, 1)}
    )


async def _resume(rep: Replication, fenced: bool) -> None:
    """Undo the hold and the fence of a switchover that did not happen."""
    if fenced and rep.primary_mode and rep.roles.is_primary:
        rep.hooks.writable = True
        await rep.start_primary_work()
    rep.switching = False
    rep.roles.notify()  # the held writes go on (or learn that we are no longer primary)


def _target(rep: Replication, to: str | None) -> str | SwitchoverAnswer:
    """The standby to hand over to: the one named, else the most advanced in sync."""
    in_sync = [n for n in rep.roles.state.in_sync if n != rep.name]
    if to is None:
        known = [n for n in in_sync if n in rep.peer_urls]
        if not known:
            return refused(409, "NO_CANDIDATE", "no standby is in sync")
        return max(known, key=lambda n: rep.shipper.acked.get(n, (0, 0)))
    if to == rep.name:
        return refused(409, "NOT_IN_SYNC", f"{to} is this replica, the primary already")
    if to not in in_sync:
        return refused(
            409, "NOT_IN_SYNC", f"{to} is not in the in-sync set {in_sync} (or not a replica)"
        )
    if to not in rep.peer_urls:
        return refused(409, "NOT_IN_SYNC", f"{to} has not fetched from this primary yet")
    return to


async def _until(rep: Replication, done: Callable[[], bool], deadline: float) -> None:
    """Wait for ``done``, woken by new frames and fetches; TimeoutError past ``deadline``."""
    loop = asyncio.get_running_loop()
    while not done():
        left = deadline - loop.time()
        if left <= 0:
            raise TimeoutError
        # The pipeline's idleness moves without a notify: look again soon.
        await rep.shipper.changed.wait(min(left, 0.01))


async def _settle(rep: Replication, target: str) -> LeaseRecord:
    """The hand-over CAS got no answer: find out whether it happened."""
    roles = rep.roles
    for _ in range(3):
        try:
            record = await roles.client.get()
        except LeaseUnavailable:
            continue
        if record is not None and record.holder == target and record.term > roles.state.term:
            await roles.step_down(record)
            return record
        if record is not None and record.holder == rep.name and record.term == roles.state.term:
            raise LeaseUnavailable("the Lease was not changed")
        break
    await roles.step_down()  # unknown: writing on could be under a term given away
    raise LeaseConflict("the outcome of the hand-over is unknown: stepped down")
