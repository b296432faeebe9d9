"""The read fence: whether this replica may answer reads now (docs/replication.md,
"Reads"), the protocol layer's ``ReadGate``.

A replica answers reads only while it knows it is current within
``replication_read_staleness``: the primary while it may acknowledge (renewed
within the renew deadline, so that no other primary can exist) and once what
it took over with is settled (``Shipper.settled``: no later election can roll
it back), a standby until its last stamp the primary answered plus the bound
(``freshness.py``), and never while its readers may see frames past every
commit point it heard (after a restart, a re-copy or a step-down:
``Freshness.hold``).
Past that every stream read gets 503 with ``Retry-After: 1``,
``Stream-Primary`` when known, and a JSON error saying why; a live read
waiting at the tail is woken the moment freshness runs out (``stale``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from stream_server.declared.groups import ReplicationSettings
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.standby.freshness import Freshness

RETRY_AFTER = 1  # seconds: a failover or an ISR change is a lease round away


class ReadFence:
    def __init__(
        self,
        settings: ReplicationSettings,
        roles: RoleLoop,
        freshness: Freshness,
        primary: Callable[[], bool],
        settled: Callable[[], bool] = lambda: True,
    ) -> None:
        self.settings = settings
        self.roles = roles
        self.freshness = freshness
        self.primary = primary  # this replica is in primary mode
        # The primary's frames cannot be rolled back by a later election (``Shipper.settled``).
        self.settled = settled
        self._stale: asyncio.Future[None] | None = None  # ``stale``: live reads wait on it

    def fresh_for(self) -> float:
        """Seconds this replica's reads stay current within the bound (0: stale): the
        primary's while it may acknowledge and all it holds is settled, else what the
        standby's stamps show."""
        if self.primary():
            return self.roles.acknowledge_for if self.settled() else 0.0
        return self.freshness.fresh_for()

    def stale(self) -> asyncio.Future[None]:
        """Resolves once this replica's reads stop being current (``ReadGate.stale``).
        One future for every live read, and one timer at the moment freshness would
        run out, moved on when it was renewed meanwhile."""
        if self._stale is None or self._stale.done():
            self._stale = asyncio.get_running_loop().create_future()
            self._check_stale()
        return self._stale

    def _check_stale(self) -> None:
        future = self._stale
        if future is None or future.done():
            return
        left = self.fresh_for()
        if left <= 0:
            future.set_result(None)
        else:
            asyncio.get_running_loop().call_later(left, self._check_stale)

    def read_refusal(self) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """None while reads here may be answered (as up to date); else the 503 to give
        (status, headers, body). Changes nothing."""
        if self.fresh_for() > 0:
            return None
        bound = self.settings.replication_read_staleness
        if self.primary() and not self.settled():
            why = (
                "this primary took over holding writes that no quorum has confirmed; reads "
                "are refused until a standby in sync holds them too (a moment after a failover)"
            )
        elif self.primary():
            why = (
                f"this primary could not renew its Lease within {self.roles.config.renew_deadline:g}"
                f" s and may have been replaced; reads are refused past the {bound:g} s "
                "staleness bound until it renews or follows the new primary"
            )
        elif self.freshness.holding:
            why = (
                f"this replica holds writes up to lsn {self.freshness.unconfirmed} that no "
                f"commit point it heard covers (commit point {self.freshness.commit}: it "
                "restarted, was re-copied or stepped down); reads are refused until its "
                "primary confirms them"
            )
        elif (age := self.freshness.age()) is None:
            why = (
                "this replica has not yet heard from a primary that may acknowledge; reads are "
                f"refused until it has (staleness bound {bound:g} s)"
            )
        else:
            why = (
                f"this replica last heard from its primary {age:.1f} s ago; reads are refused "
                f"past the {bound:g} s staleness bound"
            )
        headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", b"no-store"),
            (b"retry-after", str(RETRY_AFTER).encode()),
        ]
        primary = self.roles.state.primary_url
        if primary and primary.rstrip("/") != self.settings.replica_url.rstrip("/"):
            headers.append((b"stream-primary", primary.encode()))
        body = {"error": {"code": "STALE_REPLICA", "message": why}}
        return 503, headers, json.dumps(body).encode()
