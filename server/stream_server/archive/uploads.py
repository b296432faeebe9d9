"""The frames read but not yet archived, and which of them make the next upload.

Frames are grouped into one object while they are of one term and their lsns
follow one another (a frames object holds consecutive frames of one term), up
to ``archive_object_bytes``. A group is due when it is full, when frames of
another term (or after a gap) follow it, when its oldest frame is
``archive_timeout`` old, or at once in ``required`` mode.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from stream_format.archive import History
from stream_server.archive.archive_end import term_of
from stream_server.archive.wal_source import Read

if TYPE_CHECKING:
    from stream_server.archive.archiver import ArchiverSettings

IDLE_POLL = 1.0  # seconds between looks at the WAL with nothing pending (woken per batch)


class Batch:
    def __init__(self, settings: ArchiverSettings) -> None:
        self.settings = settings
        self.reads: list[Read] = []
        self.size = 0

    def add(self, reads: list[Read], archived: int) -> None:
        for r in reads:
            if r.frame.lsn > archived:
                self.reads.append(r)
                self.size += len(r.frame.frame)

    def group(self, history: History) -> tuple[int, list[Read], bool]:
        """(term, the leading frames that make one object, whether more follow it)."""
        first = self.reads[0].frame.lsn
        term = term_of(history, first)
        size = 0
        out: list[Read] = []
        for r in self.reads:
            lsn = r.frame.lsn
            if out and (
                lsn != out[-1].frame.lsn + 1
                or term_of(history, lsn) != term
                or size >= self.settings.object_bytes
            ):
                return term, out, True
            out.append(r)
            size += len(r.frame.frame)
        return term, out, size >= self.settings.object_bytes

    def due(self, history: History, hurry: bool = False) -> tuple[int, list[Read]] | None:
        """The next object to upload, or None while none is due (``hurry``: any frames
        are due, as at a clean shutdown)."""
        if not self.reads:
            return None
        term, out, closed = self.group(history)
        oldest = self.reads[0].frame.time_us / 1e6
        if (
            closed
            or hurry
            or self.settings.required
            or time.time() - oldest >= self.settings.timeout
        ):
            return term, out
        return None

    def drop(self, held: int) -> None:
        """Forget the frames the archive now holds (at or below ``held``)."""
        keep = [r for r in self.reads if r.frame.lsn > held]
        self.size -= sum(len(r.frame.frame) for r in self.reads if r.frame.lsn <= held)
        self.reads = keep

    def position_of(self, lsn: int) -> tuple[int, int] | None:
        for r in self.reads:
            if r.frame.lsn == lsn:
                return r.number, r.end
        return None

    def oldest(self) -> float | None:
        return self.reads[0].frame.time_us / 1e6 if self.reads else None

    def wait(self) -> float:
        """Seconds until the oldest frame is due (a wake-up per batch comes sooner)."""
        oldest = self.oldest()
        if oldest is None:
            return IDLE_POLL
        return max(self.settings.timeout - (time.time() - oldest), 0.01)
