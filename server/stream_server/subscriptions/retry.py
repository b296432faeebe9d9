"""Webhook retry schedule: exponential backoff from 1 s to 60 s with 20% jitter (PROTOCOL.md 7.1).

The nominal delays are 1, 2, 4, 8, 16, 32, 60, 60, ... seconds; each is then
spread by up to 20% either way, so that many subscriptions failing together
(a receiver that went down) do not come back in lock-step. The cap applies to
the nominal delay, so a delay at the cap lies between 48 and 72 seconds.

The caller persists the resulting ``next_attempt_at`` (an absolute time), not
the delay: a restarted server must honour the schedule it had, not start it
over.
"""

from __future__ import annotations

import random

BASE_DELAY = 1.0
MAX_DELAY = 60.0
JITTER = 0.2
# 2**6 = 64 > 60: past this many failures the nominal delay is the cap (and no float
# overflow for a subscription that has failed a million times).
_CAP_EXPONENT = 6


def nominal_delay(attempt: int) -> float:
    """The un-jittered delay after ``attempt`` consecutive failures (the first failure is 1;
    anything below counts as 1)."""
    exponent = min(max(attempt, 1) - 1, _CAP_EXPONENT)
    return min(BASE_DELAY * 2.0**exponent, MAX_DELAY)


def next_delay(attempt: int, rand: random.Random | None = None) -> float:
    """Seconds to wait before the next try after ``attempt`` consecutive failures."""
    spread = (rand or random).uniform(1.0 - JITTER, 1.0 + JITTER)
    return nominal_delay(attempt) * spread


def next_attempt_at(attempt: int, now: float, rand: random.Random | None = None) -> float:
    """The absolute time (same clock as ``now``) to store as ``next_attempt_at``."""
    return now + next_delay(attempt, rand)
