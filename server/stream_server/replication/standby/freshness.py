"""How current a standby's reads are: Raft's ReadIndex, timed by the standby's clock.

A replica may answer a read "up to date" (``Stream-Up-To-Date``, SSE's
``upToDate``) only while it knows that it misses no write acknowledged more
than ``replication_read_staleness`` seconds ago (docs/replication.md,
"Reads"). A standby learns it this way, with no clock shared between
machines:

- it stamps what it sends its primary with its own clock (``clock.now_ns``):
  each acknowledgement on the stream carries the stamp;
- the primary echoes, in every stream message it sends, the newest stamp it
  has received on that stream, only while it may acknowledge writes (renewed
  within the renew deadline, so no other primary can exist) and has settled
  what it took over (``Shipper.echoing``): otherwise it echoes 0, which
  renews nothing (``heard``). The echo is the only thing that renews a
  standby's freshness;
- a message that echoes stamp ``t`` and carries commit point ``c`` was built
  after the primary received ``t``, by the one replica that could
  acknowledge anything at that moment, so every write acknowledged before
  ``t`` is at or below ``c``. Once everything up to ``c`` is visible here,
  the standby's reads miss nothing acknowledged before ``t``: it is
  *current as of* ``t``, and fresh until ``t + bound`` on its own clock.

A message delivered late (a standby or a network paused, the bytes
buffered) carries an old stamp and renews nothing past it. The argument
assumes only that the two clocks run at rates that differ by less than
``lease_duration / lease_renew_deadline``, as the Lease itself does.

What readers here see must itself be confirmed: a standby that starts
(after a restart, or a re-copy, which restarts it) shows everything its
data directory holds, and a replica that steps down shows what it took over
or wrote as primary; either may run past the last commit point it heard, a
tail a later election can still roll back. ``hold`` marks that point: no
answer makes the standby current until its commit point covers it (the
primary confirmed the tail; one that lacks it says ``diverged`` instead, and
this replica is re-copied). The commit point a standby heard is therefore not
kept on disk: a restarted standby hears it again from its primary, within a
heartbeat when that primary holds what it does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from stream_server.replication.lease.boottime import now_ns

# Stamps heard whose commit point is not visible yet: in flight while frames are
# applied, a few per round trip. Past this many, newer ones are not kept (that
# only delays freshness).
PENDING_MAX = 1024
NS = 1_000_000_000


class Freshness:
    """A standby's knowledge of how current it is (module doc)."""

    def __init__(self, bound: float, clock: Callable[[], int] = now_ns) -> None:
        self.bound = bound
        self._bound_ns = int(bound * NS)
        self.clock = clock
        # Our clock (ns) as of which every acknowledged write is visible here; 0: none yet.
        self.current_at = 0
        self._pending: deque[tuple[int, int]] = deque()  # (stamp, commit point) not visible yet
        # Readers here may see up to this lsn without a commit point covering it (``hold``).
        self.unconfirmed = 0
        self.commit = 0  # the highest commit point heard with an echo

    def hold(self, lsn: int) -> None:
        """Readers here see up to ``lsn``, which may run past every commit point heard
        (this replica starts as a standby, or steps down to one): not current from
        now until an answer's commit point covers ``lsn`` (module doc)."""
        self.unconfirmed = max(self.unconfirmed, lsn)
        self.current_at = 0
        self._pending.clear()

    @property
    def holding(self) -> bool:
        """Whether readers here may see frames no commit point heard covers yet."""
        return self.commit < self.unconfirmed

    def stamp(self) -> int:
        """The stamp to send now (an acknowledgement's)."""
        return self.clock()

    def heard(self, stamp: int, commit: int, visible: int) -> None:
        """A primary that may acknowledge answered our ``stamp`` (0: it did not echo one)
        with commit point ``commit``; readers here see everything up to ``visible``."""
        if stamp <= self.current_at:
            return
        self.commit = max(self.commit, commit)
        if commit < self.unconfirmed:
            return  # readers here may see what this commit point does not cover (``hold``)
        if commit <= visible:
            # Supersedes every older stamp still waiting, whatever its commit point.
            self.current_at = stamp
            self._pending.clear()
            return
        pending = self._pending
        if (not pending or pending[-1][0] < stamp) and len(pending) < PENDING_MAX:
            pending.append((stamp, commit))

    def visible(self, lsn: int) -> None:
        """Readers here see everything up to ``lsn`` now."""
        pending = self._pending
        while pending and pending[0][1] <= lsn:
            self.current_at = pending.popleft()[0]

    def fresh_for(self) -> float:
        """Seconds this replica's reads stay current within the bound (0: stale)."""
        if not self.current_at:
            return 0.0
        return max(0.0, (self.current_at + self._bound_ns - self.clock()) / NS)

    def age(self) -> float | None:
        """Seconds since this replica was last known current (None: never)."""
        if not self.current_at:
            return None
        return (self.clock() - self.current_at) / NS
