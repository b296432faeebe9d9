"""The one clock that decides when time-based rules fire: TTLs, Expires-At, retention ages.

Every such rule reads the time through a ``Clock`` handed to it by the store
(``StreamStore(clock=...)``), never ``time.time()`` directly, so a test can
move time on instead of waiting it out, and all the rules agree on what
"now" is. It is a plain callable, not an object with a method: the store
reads it on every request, and the real one (``time.time``) costs one call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]
"""Seconds since the epoch (wall-clock time: expiry times are stored and compared as such)."""

WALL_CLOCK: Clock = time.time


class ManualClock:
    """A clock that moves only when told to (tests): ``clock.now += 61``."""

    def __init__(self, now: float | None = None) -> None:
        self.now = time.time() if now is None else now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
