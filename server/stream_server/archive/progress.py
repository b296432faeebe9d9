"""What the archiver has done and what it lacks: read by ``/_archive/status``, the
metrics, the write admission (the pending bound) and the ack gate of
``--archive-mode required``. Written by the archiver thread only; readers take
the values as they are (each is one attribute, replaced whole)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stream_server.archive.catalog import rfc3339

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
