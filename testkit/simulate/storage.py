"""A member's simulated disk: its WAL frames, written and then flushed.

What a crash keeps is what was flushed (fdatasync returned); frames written
but not yet flushed are lost, as an OS page cache's are. A flush takes a
while (drawn by the member), and covers what was written when it began.
``durable`` and ``term_end`` are what the shipper and the role loop ask of
``engine.replica.ReplicaHooks``, computed the same way from the frames.
"""

from __future__ import annotations

import asyncio

Frame = tuple[int, int, bytes]  # (term, lsn, frame bytes), as the shipper holds them
Position = tuple[int, int]


class Storage:
    def __init__(self) -> None:
        self.frames: list[Frame] = []  # lsn i + 1 at index i: the WAL, written
        self.flushed = 0  # how many of them are durable
        self._epoch = 0  # bumped by a crash: a flush under way then does not complete

    @property
    def durable(self) -> Position:
        """The last durable frame's (term, lsn) (``ReplicaHooks.durable``)."""
        return self.frames[self.flushed - 1][:2] if self.flushed else (0, 0)

    @property
    def written(self) -> Position:
        return self.frames[-1][:2] if self.frames else (0, 0)

    @property
    def lsn(self) -> int:
        return self.flushed

    @property
    def term_floor(self) -> int:
        return max((t for t, _, _ in self.frames[: self.flushed]), default=0)

    def write(self, frames: list[Frame]) -> None:
        for frame in frames:
            if frame[1] != len(self.frames) + 1:
                raise ValueError(f"frame {frame[1]} does not follow lsn {len(self.frames)}")
            self.frames.append(frame)

    async def flush(self, delay: float) -> None:
        """Make everything written so far durable, ``delay`` seconds from now."""
        upto, epoch = len(self.frames), self._epoch
        await asyncio.sleep(delay)
        if epoch == self._epoch:
            self.flushed = max(self.flushed, upto)

    def crash(self) -> None:
        del self.frames[self.flushed :]
        self._epoch += 1

    def replace(self, frames: list[Frame]) -> None:
        """A re-copy: the primary's durable frames, durable here too."""
        self.frames = list(frames)
        self.flushed = len(self.frames)
        self._epoch += 1

    def term_end(self, term: int, last_lsn: int) -> int | None:
        """The last lsn written under ``term`` in this history (None: never its term),
        as ``ReplicaHooks.term_end`` answers from the term history."""
        end = None
        for t, lsn, _ in reversed(self.frames[: self.flushed]):
            if t == term:
                return last_lsn if end is None else end
            end = lsn - 1 if t > term else end
        return None

    def content(self, upto: int) -> bytes:
        return b"".join(f for _, _, f in self.frames[:upto])


class Hooks:
    """The two things the shipper asks of the engine's replica hooks, from ``Storage``."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    @property
    def durable(self) -> Position:
        return self.storage.durable

    def term_end(self, term: int, last_lsn: int) -> int | None:
        return self.storage.term_end(term, last_lsn)
