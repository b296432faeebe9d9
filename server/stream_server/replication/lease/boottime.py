"""The clock a replica measures its own time spans by: CLOCK_BOOTTIME.

Every replication deadline (the Lease's expiry and renew deadline, a standby's
silence, a read's freshness) is measured on it. CLOCK_MONOTONIC
(``time.monotonic``) stops while the machine is suspended (a VM paused by its
host, a laptop's lid), so a replica that slept would wake believing that no
time had passed: its lease not run out, its reads still current, while the
others, whose clocks ran, have long taken over. CLOCK_BOOTTIME counts on
through a suspend and, like CLOCK_MONOTONIC, is never set back. It is Linux's;
where it does not exist (a laptop running a single node), CLOCK_MONOTONIC
stands in.

Readings are local: a reading means nothing on another machine, and none is
ever compared with another machine's. A stamp sent to a peer comes back
unchanged (the read freshness echo, ``freshness.py``) and is compared with
this replica's own clock only.
"""

from __future__ import annotations

import time

CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def now() -> float:
    """Seconds on this replica's clock."""
    return time.clock_gettime(CLOCK)


def now_ns() -> int:
    """Nanoseconds on this replica's clock (never 0 on a running machine)."""
    return time.clock_gettime_ns(CLOCK)
