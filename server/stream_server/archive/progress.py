"""Progress: what the archiver has done and what it lacks (``ArchiveProgress``), and
how far a long command (``backup``, ``restore``) has got (``Meter``).

``ArchiveProgress`` is read by ``/_archive/status``, the metrics, the write admission
(the pending bound) and the ack gate of ``--archive-mode required``. Written by the
archiver thread only; readers take the values as they are (each is one attribute,
replaced whole).

A ``Meter`` writes the bytes and objects done and the rate to stderr (stdout carries
the command's one JSON document, which must stay parseable): on a terminal one line
rewritten in place, else a log line; at most every ``every`` seconds however often it
is fed, and once more when the work ends. The code doing the work reports through
``note()`` into whichever meter the command made current (``reporting``), so that the
functions between the command and the transfer need no extra parameter.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

from stream_format.archive import rfc3339

KINDS = ("unavailable", "denied", "damaged")


@dataclass
class ArchiveProgress:
    url: str
    mode: str  # async | required
    role: str = "off"  # archiving | standby | off
    archived_lsn: int = 0
    archived_term: int = 0
    published: Callable[[], int] = lambda: 0  # the engine's published lsn, read live
    lag_bytes: int = 0
    pending_bytes: int = 0
    oldest_unarchived: float | None = None  # time.time() of the oldest frame not archived
    failing: bool = False
    last_error: str | None = None
    last_error_kind: str | None = None
    last_archived_at: float | None = None
    last_backup_at: float | None = None  # the archive's newest base backup (seconds)
    uploads: int = 0
    uploaded_bytes: int = 0
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    @property
    def durable_lsn(self) -> int:
        return self.published()

    @property
    def lag_frames(self) -> int:
        return max(self.durable_lsn - self.archived_lsn, 0)

    @property
    def lag_seconds(self) -> float:
        if self.lag_frames == 0 or self.oldest_unarchived is None:
            return 0.0
        return max(time.time() - self.oldest_unarchived, 0.0)

    def document(self) -> dict[str, object]:
        """The body of ``GET /_archive/status`` (docs/archive.md)."""
        at = self.last_archived_at
        return {
            "enabled": True,
            "url": self.url,
            "mode": self.mode,
            "role": self.role,
            "archived_lsn": self.archived_lsn,
            "archived_term": self.archived_term,
            "durable_lsn": self.durable_lsn,
            "lag_frames": self.lag_frames,
            "lag_bytes": self.lag_bytes,
            "lag_seconds": round(self.lag_seconds, 3),
            "pending_bytes": self.pending_bytes,
            "failing": self.failing,
            "last_error": self.last_error,
            "last_error_kind": self.last_error_kind,
            "last_archived_at": None if at is None else rfc3339(at),
        }


OFF_DOCUMENT: dict[str, object] = {
    "enabled": False,
    "url": None,
    "mode": "async",
    "role": "off",
    "archived_lsn": 0,
    "archived_term": 0,
    "durable_lsn": 0,
    "lag_frames": 0,
    "lag_bytes": 0,
    "lag_seconds": 0.0,
    "pending_bytes": 0,
    "failing": False,
    "last_error": None,
    "last_error_kind": None,
    "last_archived_at": None,
}


# ------------------------------------------------------------------ a command's meter


class Meter:
    """Bytes and objects done by one command, shown at a bounded rate on ``out``."""

    def __init__(
        self,
        what: str,
        out: TextIO | None = None,
        *,
        every: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
    ) -> None:
        self.what = what
        self.out = sys.stderr if out is None else out
        self.every = every
        self.clock = clock
        self.tty = self.out.isatty() if tty is None else tty
        self.started = clock()
        self.shown = self.started
        self.bytes = 0
        self.objects: int | None = None  # None: not known (yet)

    def add(self, nbytes: int, objects: int = 0) -> None:
        self.set(self.bytes + nbytes, (self.objects or 0) + objects)

    def set(self, nbytes: int, objects: int | None) -> None:
        """The totals so far (a meter fed from a poll); shown when ``every`` has passed."""
        self.bytes, self.objects = nbytes, objects
        now = self.clock()
        if now - self.shown >= self.every:
            self.shown = now
            self._show(now, final=False)

    def finish(self) -> None:
        """The last line (always written: a short command shows what it did too)."""
        self._show(self.clock(), final=True)

    def line(self, now: float) -> str:
        seconds = max(now - self.started, 1e-9)
        rate = self.bytes / seconds / 2**20
        objects = "" if self.objects is None else f", {self.objects} objects"
        return (
            f"{self.what}: {self.bytes / 2**20:.1f} MiB{objects}, {rate:.1f} MiB/s, "
            f"{now - self.started:.0f} s"
        )

    def _show(self, now: float, *, final: bool) -> None:
        text = self.line(now) + (" (done)" if final else "")
        if self.tty:
            self.out.write("\r\x1b[K" + text + ("\n" if final else ""))
        else:
            self.out.write(text + "\n")
        self.out.flush()


_current: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("meter", default=None)


@contextlib.contextmanager
def reporting(meter: Meter) -> Iterator[Meter]:
    """Make ``meter`` the one ``note`` feeds (in this thread) while the block runs."""
    token = _current.set(meter)
    try:
        yield meter
    finally:
        _current.reset(token)


def note(nbytes: int, objects: int = 1) -> None:
    """Work done, for the current meter (nothing when no command is metering)."""
    meter = _current.get()
    if meter is not None:
        meter.add(nbytes, objects)
