"""The recent-read window: the last commits of a stream kept in memory while readers wait.

Woken long-poll and SSE readers ask for exactly what was just committed.
Keeping those payloads for streams with waiting readers serves them without
a disk read or a thread hop. Only streams with waiters keep a window, and at
most about ``RECENT_MAX_BYTES`` each; a window only ever grows by commits
that follow it directly, so it always holds one contiguous run of units.
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_format.records import KIND_BYTES

RECENT_MAX_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RecentWindow:
    """Payloads covering units ``first`` up to ``stop``, ``size`` bytes in all."""

    first: int
    stop: int
    payloads: list[bytes]
    size: int

    def serve(
        self, start: int, tail: int, max_bytes: int, *, kind: int, fork_offset: int
    ) -> tuple[list[bytes | memoryview], int] | None:
        """Up to ``max_bytes`` from ``start`` and the unit after them, or None to read the log.

        The window answers only when it reaches the committed ``tail`` and
        ``start`` lies inside it (and inside the stream's own data, not a fork
        source's).
        """
        if not (self.first <= start < self.stop == tail) or start < fork_offset:
            return None
        out: list[bytes | memoryview] = []
        unit, total = self.first, 0
        for payload in self.payloads:
            units = len(payload) if kind == KIND_BYTES else 1
            if unit + units <= start:
                unit += units
                continue
            if kind == KIND_BYTES:
                part = memoryview(payload)[start - unit if unit < start else 0 :]
                part = part[: max_bytes - total]
                out.append(part)
                total += len(part)
                unit = max(unit, start) + len(part)
            else:
                if out and total + len(payload) > max_bytes:
                    break
                out.append(payload)
                total += len(payload)
                unit += 1
            if total >= max_bytes:
                break
        return out, unit


def remember(
    window: RecentWindow | None, first: int, stop: int, payloads: list[bytes]
) -> RecentWindow | None:
    """The window after a commit of ``payloads`` covering ``first`` up to ``stop``."""
    size = sum(map(len, payloads))
    if window is not None and window.stop == first and window.size + size <= RECENT_MAX_BYTES:
        return RecentWindow(window.first, stop, window.payloads + payloads, window.size + size)
    return RecentWindow(first, stop, list(payloads), size) if size <= RECENT_MAX_BYTES else None
