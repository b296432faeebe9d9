"""Optional per-client request rate limiting (token buckets); 429 with Retry-After."""

from __future__ import annotations

import math
import time
from collections import OrderedDict

MAX_CLIENTS = 100_000  # buckets kept; the least recently seen are dropped first


class RateLimiter:
    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = float(burst)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    async def admit(self, client: str) -> float:
        """``acquire`` as the protocol layer asks it (a worker process asks the writer's
        limiter instead, over its link: ``workers/linked_limits.py``)."""
        return self.acquire(client)

    def acquire(self, client: str, now: float | None = None) -> float:
        """0 if the request may go ahead, else the seconds to wait before retrying."""
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.pop(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[client] = (tokens, now)
        if len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)
        return wait


def retry_after(wait: float) -> str:
    return str(max(1, math.ceil(wait)))
