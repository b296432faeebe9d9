"""The clock every replication deadline is measured by.

``CLOCK_BOOTTIME`` rather than ``time.monotonic`` (``CLOCK_MONOTONIC``): both
never go back, but the monotonic clock stops while the machine is suspended
(a VM paused by its host, a laptop's lid), so a primary that wakes would
believe its Lease was renewed moments ago while the others, whose clocks
ran, have long taken over. The boot-time clock counts the suspension too, as
client-go's leader election does with its wall-clock stamps.
"""

from __future__ import annotations

import time

_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)  # Linux; elsewhere monotonic


def now() -> float:
    """Seconds on a clock that never goes back and keeps counting through a suspend."""
    return time.clock_gettime(_CLOCK)
