"""The write fence: whether this replica may take a write now, else the answer.

Writes reaching a standby are refused with 503, ``Retry-After: 1`` and
``Stream-Primary: <url>`` rather than forwarded (docs/replication.md says
why). A primary with fewer than ``min_in_sync`` replicas in sync waits up to
``replication_wait`` for them, then refuses with 503 too; in ``preferred``
durability it writes alone and reports itself degraded. During a switchover
(``switchover.py``) writes are held the same way. The app asks before each
write reaches the protocol layer; the wait is woken by the role loop's state
changes, not by a timer.
"""

from __future__ import annotations

import asyncio
import contextlib

from stream_server.declared.groups import ReplicationSettings
from stream_server.protocol.refusal import Refusal
from stream_server.replication.fences.read_fence import RETRY_AFTER
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.role_switch import RoleSwitch
from stream_server.replication.switchover import Switchover


class WriteFence:
    def __init__(
        self,
        settings: ReplicationSettings,
        roles: RoleLoop,
        quorum: int,
        modes: RoleSwitch,
        switchover: Switchover,
    ) -> None:
        """``modes``: whether this replica writes; ``switchover``: whether a
        switchover holds new writes."""
        self.settings = settings
        self.roles = roles
        self.quorum = quorum
        self.modes = modes
        self.switchover = switchover

    @property
    def in_sync_enough(self) -> bool:
        return 1 + len(self.roles.state.in_sync) >= self.quorum

    @property
    def open(self) -> bool:
        """Whether a write may be taken now, without a wait (``refusal`` gives None at once):
        the writer's fast path for its workers' writes (``app.store_clear``)."""
        return (
            self.modes.primary
            and self.roles.may_acknowledge
            and not self.switchover.switching
            and (self.in_sync_enough or self.settings.replication_durability == "preferred")
        )

    async def refusal(self) -> Refusal | None:
        """None when this replica may take a write now; else the answer to give."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.replication_wait
        while True:
            state = self.roles.state
            if not (self.modes.primary and self.roles.may_acknowledge):
                return self._not_primary()
            if self.open:
                return None
            left = deadline - loop.time()
            if left <= 0:
                why = (
                    "a switchover is in progress: retry\n"
                    if self.switchover.switching
                    else f"too few replicas in sync: {1 + len(state.in_sync)} of the "
                    f"{self.quorum} required\n"
                )
                return Refusal(503, [(b"retry-after", str(RETRY_AFTER).encode())], why.encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.changed.wait(), left)

    def _not_primary(self) -> Refusal:
        primary = self.roles.state.primary_url
        headers = [(b"retry-after", str(RETRY_AFTER).encode())]
        if primary and not self.roles.is_primary:
            headers.append((b"stream-primary", primary.encode()))
            body = f"this replica is a standby; write to the primary at {primary}\n"
        else:
            body = "this replica is not the primary right now; retry\n"
        return Refusal(503, headers, body.encode())
