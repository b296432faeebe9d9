"""Stream-Cursor values: time intervals that only move forward, for CDN collapsing."""

from __future__ import annotations

import random
import time

CURSOR_EPOCH = 1728432000.0  # 2024-10-09T00:00:00Z
CURSOR_INTERVAL = 20.0


def next_cursor(client_cursor: str | None, now: float | None = None) -> str:
    """The current interval, or past the client's cursor if it is not behind.

    A client echoing a cursor from the current interval (or ahead of it) gets a
    strictly larger one, moved on by 1 to 3600 seconds of jitter, so that a
    cached empty response can never be served to it again.
    """
    current = int(((now if now is not None else time.time()) - CURSOR_EPOCH) // CURSOR_INTERVAL)
    if client_cursor is not None and client_cursor.isdigit() and len(client_cursor) < 20:
        previous = int(client_cursor)
        if previous >= current:
            jitter = random.randint(1, 3600)
            current = previous + max(1, int(jitter // CURSOR_INTERVAL))
    return str(current)
