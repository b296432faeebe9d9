"""The frames read but not yet archived, and which of them make the next upload.

Frames are grouped into one object while they are of one term and their lsns
follow one another (a frames object holds consecutive frames of one term), up
to ``archive_object_bytes``. A group is due when it is full, when frames of
another term (or after a gap) follow it, when its oldest frame is
``archive_timeout`` old, or at once in ``required`` mode.
"""

from __future__ import annotations

import time

from stream_format.archive import History, term_of
from stream_server.archive.upload.wal_source import Read
from stream_server.declared.groups import ArchiveSettings

IDLE_POLL = 1.0  # seconds between looks at the WAL with nothing pending (woken per batch)


class Batch:
    def __init__(self, settings: ArchiveSettings) -> None:
        self.settings = settings
        self.reads: list[Read] = []
        self.terms: list[int] = []  # each read's term
        self.size = 0
        # Where the frames held break (another term, a gap): the group before the
        # first break is due. Kept as frames come, so that a round that uploads
        # nothing does not walk the batch (rounds come every few ms under load).
        self.breaks = 0

    def add(self, reads: list[Read], archived: int, history: History) -> None:
        for r in reads:
            lsn = r.frame.lsn
            if lsn <= archived:
                continue
            term = term_of(history, lsn)
            if self.reads and self._breaks_at(self.reads[-1], self.terms[-1], r, term):
                self.breaks += 1
            self.reads.append(r)
            self.terms.append(term)
            self.size += len(r.frame.frame)

    @staticmethod
    def _breaks_at(before: Read, before_term: int, after: Read, after_term: int) -> bool:
        return after.frame.lsn != before.frame.lsn + 1 or after_term != before_term

    def group(self) -> tuple[int, list[Read]]:
        """(term, the leading frames that make one object): up to the first break or
        ``archive_object_bytes``."""
        size = 0
        out: list[Read] = []
        for i, r in enumerate(self.reads):
            if out and (
                self._breaks_at(self.reads[i - 1], self.terms[i - 1], r, self.terms[i])
                or size >= self.settings.archive_object_bytes
            ):
                break
            out.append(r)
            size += len(r.frame.frame)
        return self.terms[0], out

    def due(self, hurry: bool = False) -> tuple[int, list[Read]] | None:
        """The next object to upload, or None while none is due (``hurry``: any frames
        are due, as at a clean shutdown)."""
        if not self.reads:
            return None
        if (
            self.breaks
            or hurry
            or self.settings.archive_mode == "required"
            or self.size >= self.settings.archive_object_bytes
            or time.time() - self.reads[0].frame.time_us / 1e6 >= self.settings.archive_timeout
        ):
            return self.group()
        return None

    def drop(self, held: int) -> None:
        """Forget the frames the archive now holds (at or below ``held``)."""
        cut = 0
        while cut < len(self.reads) and self.reads[cut].frame.lsn <= held:
            self.size -= len(self.reads[cut].frame.frame)
            cut += 1
        if cut:
            self.reads, self.terms = self.reads[cut:], self.terms[cut:]
            self.breaks = sum(
                self._breaks_at(self.reads[i - 1], self.terms[i - 1], self.reads[i], self.terms[i])
                for i in range(1, len(self.reads))
            )

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
        return max(self.settings.archive_timeout - (time.time() - oldest), 0.01)
