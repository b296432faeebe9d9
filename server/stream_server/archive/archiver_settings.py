"""What an archiver is told: when to upload, how much WAL it may keep, how it backs
off. Apart from the archiver so that the batching (``uploads.py``) reads it without
importing the thread that drives it."""

from __future__ import annotations

from dataclasses import dataclass

DENIED_RETRY = 30.0  # seconds between attempts while the store refuses us
MAX_BACKOFF = 30.0


@dataclass(frozen=True)
class ArchiverSettings:
    timeout: float  # --archive-timeout
    object_bytes: int  # --archive-object-bytes
    max_pending_bytes: int  # --archive-max-pending-bytes
    required: bool  # --archive-mode required
    denied_retry: float = DENIED_RETRY
    max_backoff: float = MAX_BACKOFF
