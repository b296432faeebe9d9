"""Which lsns the archived frames really hold, along the newest term's history, read from
the objects' names and headers only (never their frames): what ``backups list`` reports
as recoverable and what restore checks before it downloads a byte.

A frames object's name gives its first lsn, its header (the first ``HEADER_SIZE``
bytes, one small range read) its last. Objects are immutable (written once with
``If-None-Match: *``), so a header read once is kept for the process's life, keyed by
the store, the name and the size: the server's ``GET /_archive/backups`` is polled, and
after the first listing only new objects cost a request.

Frames below the oldest object are not a gap (retention deleted them on purpose); a
*gap* is lsns missing between two objects along the history, or an object whose
header does not decode (it is named as damaged, and counted as holding nothing).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stream_format.archive import HEADER_SIZE as OBJECT_HEADER_SIZE
from stream_format.archive import (
    INDEX_ROW,
    WAL_PREFIX,
    ArchiveDamaged,
    History,
    decode_header,
    history_ranges,
    parse_wal_name,
)
from stream_server.archive.object_store import ObjectStore

NO_END = 2**63 - 1
HEADER_READS = 8  # headers read at once on a first listing of a large archive

_header_cache: dict[tuple[str, str, int], int] = {}  # (store url, name, size) -> last lsn
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class Piece:
    """The lsns ``lo..hi`` one frames object contributes along the history (clipped to
    its term's range there)."""

    lo: int
    hi: int
    term: int
    name: str
    first: int  # the object's own first lsn (its index starts there)


@dataclass(frozen=True)
class Gap:
    """Archived frames missing between two objects: no restore crosses them."""

    term: int
    first: int
    last: int
    before: str  # the object after the gap

    def describe(self) -> str:
        return (
            f"the archive misses frames {self.first}..{self.last} of term {self.term}: "
            f"no object holds them before {self.before}"
        )

    def json(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "first_lsn": self.first,
            "last_lsn": self.last,
            "before": self.before,
        }


@dataclass
class Coverage:
    pieces: list[Piece] = field(default_factory=list)  # in lsn order
    gaps: list[Gap] = field(default_factory=list)
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)

    @property
    def newest(self) -> int:
        """The last lsn any object holds along the history (0: none)."""
        return max((p.hi for p in self.pieces), default=0)

    def reach(self, after: int) -> int:
        """The last lsn a replay starting at ``after + 1`` reaches through contiguous
        objects (``after`` itself when the next frame is in none)."""
        reached = after
        for piece in self.pieces:
            if piece.lo > reached + 1:
                break  # a gap before this object
            reached = max(reached, piece.hi)
        return reached

    def gap_after(self, lsn: int) -> Gap | None:
        """The first gap at or after ``lsn + 1``, when frames follow it."""
        return next((g for g in self.gaps if g.last > lsn), None)

    def holder(self, lsn: int) -> Piece | None:
        return next((p for p in self.pieces if p.lo <= lsn <= p.hi), None)


def scan(store: ObjectStore, history: History) -> Coverage:
    """The archive's frames objects along ``history``: what they hold, where they miss."""
    wanted = _listed(store, history)
    lasts = _last_lsns(store, [(name, size) for *_, name, size in wanted])
    out = Coverage()
    for term, tfirst, tlast, first, name, _size in wanted:
        last = lasts[name]
        if isinstance(last, str):
            out.damaged.append((name, last))
            continue
        lo, hi = max(first, tfirst), min(last, tlast)
        if hi >= lo:
            out.pieces.append(Piece(lo, hi, term, name, first))
    reached: int | None = None
    for piece in out.pieces:
        if reached is not None and piece.lo > reached + 1:
            out.gaps.append(Gap(piece.term, reached + 1, piece.lo - 1, piece.name))
        reached = piece.hi if reached is None else max(reached, piece.hi)
    return out


def _listed(store: ObjectStore, history: History) -> list[tuple[int, int, int, int, str, int]]:
    """(term, its first lsn, its last lsn, object's first lsn, name, size) of each frames
    object that may hold lsns of its term's range along ``history``, in lsn order."""
    wanted = []
    for term, tfirst, tlast in history_ranges(history, NO_END):
        listed = []
        for name, size in store.objects(f"{WAL_PREFIX}{term:016x}-"):
            try:
                listed.append((parse_wal_name(name)[1], name, size))
            except ArchiveDamaged:
                continue  # not one of ours
        wanted += [(term, tfirst, tlast, f, n, z) for f, n, z in sorted(listed) if f <= tlast]
    return wanted


def _last_lsns(store: ObjectStore, objects: list[tuple[str, int]]) -> dict[str, int | str]:
    """Each object's last lsn from its header (cached), or why its header is damaged."""
    out: dict[str, int | str] = {}
    todo = []
    with _cache_lock:
        for name, size in objects:
            cached = _header_cache.get((store.url, name, size))
            if cached is None:
                todo.append(name)
            else:
                out[name] = cached
    if not todo:
        return out
    with ThreadPoolExecutor(HEADER_READS, thread_name_prefix="archive-header") as pool:
        found = list(pool.map(lambda n: _read_last(store, n), todo))
    sizes = dict(objects)
    with _cache_lock:
        for name, last in zip(todo, found, strict=True):
            out[name] = last
            if isinstance(last, int):
                _header_cache[(store.url, name, sizes[name])] = last
    return out


def _read_last(store: ObjectStore, name: str) -> int | str:
    try:
        return decode_header(name, store.get_range(name, 0, OBJECT_HEADER_SIZE))[2]
    except ArchiveDamaged as exc:
        return str(exc)


def frame_time_us(store: ObjectStore, piece: Piece, lsn: int) -> int:
    """The commit time (µs) of frame ``lsn`` of ``piece``'s object, from its index alone
    (one small range read, not the object)."""
    row = lsn - piece.first
    data = store.get_range(piece.name, OBJECT_HEADER_SIZE + row * INDEX_ROW.size, INDEX_ROW.size)
    if len(data) != INDEX_ROW.size:
        raise ArchiveDamaged(f"archive object {piece.name}: truncated in its index")
    return int(INDEX_ROW.unpack(data)[1])


def backup_reach(manifest: dict[str, Any], history: History, cover: Coverage) -> int | str:
    """The last lsn a restore from ``manifest`` can reach along ``history``, or why it
    cannot restore at all (its consistent point is past a gap, or its position is off
    the history: a deposed primary's tail)."""
    term, start, end = int(manifest["term"]), int(manifest["start_lsn"]), int(manifest["end_lsn"])
    holder = None
    for t, first in history:
        if first <= start:
            holder = t
    if holder is not None and holder != term:
        return (
            f"its position (term {term}, lsn {start}) is not on the archive's newest history "
            f"{history}: lsn {start} there is term {holder}'s"
        )
    reached = cover.reach(start)
    if reached >= end:
        return reached
    gap = cover.gap_after(reached)
    why = f" ({gap.describe()})" if gap is not None and gap.first <= end else ""
    return (
        f"it needs the archived frames up to lsn {end}; the archive holds them only up to "
        f"{reached}{why}"
    )


def reaches(
    backups: list[dict[str, Any]], history: History, cover: Coverage
) -> dict[str, int | str]:
    """``backup_reach`` of each backup, by id."""
    return {str(m["id"]): backup_reach(m, history, cover) for m in backups}
