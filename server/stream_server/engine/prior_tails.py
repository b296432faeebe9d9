"""The tails a standby's frames replace, kept as it applies them.

A standby writes every frame it receives to LMDB at once, but its readers see a
frame only once the primary's commit point covers it (``replication/standby/mirror.py``):
until then a stream's tail in the engine (and in LMDB) is ahead of what its
readers may see. A stream the stream layer loads meanwhile (the first read after
a restart, or one the hot set had dropped) would be loaded with that tail, and
show writes a later election can roll back. What the tail was before each frame
is known only as the frames are applied: read here, on the writer thread, just
before their LMDB commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream_format import wal as walmod
from stream_format.meta import DB_TAILS, decode_tail, key_stream_id

if TYPE_CHECKING:
    from stream_server.engine.engine import Engine

# Per stream id, its tail unit before a frame changed it (None: it had no tail).
Prior = dict[int, int | None]


def prior_tails(engine: Engine, frames: list[tuple[int, list[walmod.Entry]]]) -> list[Prior]:
    """Per frame, the tail unit of each stream it changes as it was just before that
    frame: the engine's for the first frame touching the stream, then the one an earlier
    frame of these set. A dict lookup per tail change, on the writer thread."""
    running: Prior = {}
    found: list[Prior] = []
    for _, changes in frames:
        before: Prior = {}
        for entry in changes:
            if entry[1] != DB_TAILS:
                continue
            sid = key_stream_id(entry[2])
            if sid not in running:
                tail = engine.tails.get(sid)
                running[sid] = tail.unit if tail is not None else None
            before.setdefault(sid, running[sid])
            running[sid] = decode_tail(entry[3]).unit if entry[0] == walmod.PUT else None
        found.append(before)
    return found
