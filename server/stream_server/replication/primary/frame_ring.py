"""The frames a primary can ship: the recent WAL frames, kept in memory, found
by lsn.

A standby further behind than the oldest frame held is told to re-copy
(docs/replication.md). Finding a standby's next frame and its lag must not
grow with the frames held (up to ``RING_BYTES`` of them), because the
primary does both for every frame it ships.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

RING_BYTES = 256 * 1024 * 1024

Frame = tuple[int, int, bytes]  # term, lsn, WAL frame


class FrameRing:
    """The frames a primary can ship, oldest first, found by lsn in O(log n).

    A list with a moving head rather than a deque, so that ``bisect`` can index
    it; ``ends`` holds the running total of frame bytes, from which the bytes
    after a position (a standby's lag) come without a scan.
    """

    def __init__(self) -> None:
        self._frames: list[Frame] = []
        self._lsns: list[int] = []
        self._ends: list[int] = []  # bytes of all frames appended up to and including i
        self._head = 0  # index of the oldest frame still held
        self.size = 0  # bytes of the frames held

    def append(self, frame: Frame) -> None:
        """Add the newest frame. A frame at or below the newest lsn replaces the
        frames from that lsn on (a history rewritten), so lsns stay ascending."""
        lsn = frame[1]
        while len(self) and self._lsns[-1] >= lsn:
            self.size -= len(self._frames.pop()[2])
            self._lsns.pop()
            self._ends.pop()
        self._frames.append(frame)
        self._lsns.append(lsn)
        self._ends.append((self._ends[-1] if self._ends else 0) + len(frame[2]))
        self.size += len(frame[2])

    def popleft(self) -> Frame:
        frame = self._frames[self._head]
        self._head += 1
        self.size -= len(frame[2])
        if self._head >= 1024 and 2 * self._head >= len(self._frames):
            del self._frames[: self._head], self._lsns[: self._head], self._ends[: self._head]
            self._head = 0
        return frame

    def first_after(self, lsn: int) -> int:
        """Index (for ``since``) of the first frame with an lsn above ``lsn``."""
        return bisect.bisect_right(self._lsns, lsn, self._head)

    def since(self, index: int) -> Iterator[Frame]:
        # A slice, not ``islice``: that walks every frame before ``index`` to get there.
        return iter(self._frames[max(index, self._head) :])

    def bytes_after(self, lsn: int) -> int:
        """Bytes of the frames held with an lsn above ``lsn``."""
        i = self.first_after(lsn)
        if i >= len(self._frames):
            return 0
        return self._ends[-1] - self._ends[i] + len(self._frames[i][2])

    def __len__(self) -> int:
        return len(self._frames) - self._head

    def __iter__(self) -> Iterator[Frame]:
        return self.since(self._head)

    def __getitem__(self, i: int) -> Frame:
        if not -len(self) <= i < len(self):
            raise IndexError("frame ring index out of range")
        return self._frames[i] if i < 0 else self._frames[self._head + i]
