"""Which units of which streams to read, and how to cut them into partitions.

Pure functions over a cut (no Spark): selection by glob and state, the unit
range each stream contributes, and bin-packing of slices into partitions of
a target size. Small streams share a partition (per-task overhead dominates
a small read); a long stream is split at indexed record boundaries, so no
record is ever cut in two by partitioning.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from stream_spark._reader import Cut, MetaReader, Piece, Slice, StreamInfo

FORKS_STITCH = "stitch"  # a fork reads as the protocol reads it: inherited records, then its own
FORKS_OWN = "own"  # only the records a stream's own log holds (no double counting across forks)
MIN_SHARE = 4 * 1024 * 1024  # smallest partition min_partitions may ask for


@dataclass(frozen=True, slots=True)
class Selection:
    """Which streams a read covers."""

    glob: str = "*"
    include_deleted: bool = False
    include_expired: bool = False
    forks: str = FORKS_STITCH

    def matches(self, info: StreamInfo) -> bool:
        if not fnmatch.fnmatchcase(info.path, self.glob):
            return False
        if info.soft_deleted and not self.include_deleted:
            return False
        return not (info.expired and not self.include_expired)

    def first_unit(self, info: StreamInfo) -> int:
        """Where a stream's data starts for this selection."""
        return info.fork_offset if self.forks == FORKS_OWN else 0


def select(cut: Cut, sel: Selection) -> list[StreamInfo]:
    """The selected streams, in path order (the order partitions and rows follow)."""
    return [cut.streams[p] for p in sorted(cut.streams) if sel.matches(cut.streams[p])]


def batch_ranges(
    cut: Cut, sel: Selection, start: int | None = None, end: int | None = None
) -> dict[str, tuple[int, int]]:
    """Units ``[a, b)`` to read per selected stream: requested offsets, cut at the tail."""
    out: dict[str, tuple[int, int]] = {}
    for info in select(cut, sel):
        # Never below the retained start: retention dropped what lies there.
        a = max(sel.first_unit(info), start or 0, cut.earliest(info.path))
        b = info.tail if end is None else min(end, info.tail)
        if a < b:
            out[info.path] = (a, b)
    return out


def pieces_for(cut: Cut, path: str, a: int, b: int, forks: str) -> list[Piece]:
    if forks == FORKS_OWN:
        info = cut.streams[path]
        lo = max(a, info.fork_offset)
        return [Piece(info, lo, b)] if lo < b else []
    return cut.chain(path, a, b)


@dataclass(slots=True)
class _Span:
    """A piece with its file positions, before splitting."""

    stream: str
    piece: Piece
    pos: int
    end_est: int

    @property
    def size(self) -> int:
        return max(self.end_est - self.pos, 1)


def _span(meta: MetaReader, stream: str, piece: Piece) -> _Span:
    owner = piece.owner
    pos, _ = meta.index_floor(owner, piece.lo)
    if piece.hi >= owner.tail:
        end = owner.file_len
    else:
        end = max(meta.index_floor(owner, piece.hi)[0], pos)
    return _Span(stream, piece, pos, end)


def _slice(
    cut: Cut, meta: MetaReader, span: _Span, first: int, last: int, pos: int, size: int
) -> Slice:
    p = span.piece
    return Slice(
        stream=span.stream,
        origin=p.owner.path,
        content_type=cut.streams[span.stream].content_type,
        kind=p.owner.kind,
        segment=meta.layout.segment_relpath(p.owner.id),
        inline=p.owner.inline,
        pos=pos,
        end_pos=p.owner.file_len,
        first=first,
        last=last,
        lo=p.lo,
        hi=p.hi,
        size=size,
    )


def plan(
    cut: Cut,
    meta: MetaReader,
    ranges: Mapping[str, tuple[int, int]],
    *,
    forks: str = FORKS_STITCH,
    target_bytes: int = 128 * 1024 * 1024,
    min_partitions: int = 1,
    min_share: int = MIN_SHARE,
) -> list[list[Slice]]:
    """Slices packed into partitions of about ``target_bytes`` (balanced, in path order).

    The number of partitions is what the target asks for, or ``min_partitions``
    when that is more; every partition then gets an equal share, so that the
    last task is not the only one still running. ``min_partitions`` never
    makes partitions smaller than ``min_share``: below that a task costs more
    to start than to run.
    """
    spans = [
        _span(meta, path, piece)
        for path in sorted(ranges)
        for piece in pieces_for(cut, path, *ranges[path], forks)
    ]
    if not spans:
        return []
    total = sum(s.size for s in spans)
    wanted = min(min_partitions, math.ceil(total / max(min_share, 1)))
    n = max(wanted, math.ceil(total / max(target_bytes, 1)), 1)
    share = max(math.ceil(total / n), 1)
    slices: list[Slice] = []
    for span in spans:
        slices.extend(_split(cut, meta, span, share))
    return _pack(slices, share)


def _split(cut: Cut, meta: MetaReader, span: _Span, share: int) -> Iterable[Slice]:
    """One slice, or several cut at indexed record starts when the span exceeds ``share``."""
    p = span.piece
    if span.size <= share:
        yield _slice(cut, meta, span, p.lo, p.hi, span.pos, span.size)
        return
    first, pos = p.lo, span.pos
    for unit, bpos in meta.boundaries(p.owner, p.lo, p.hi):
        if bpos - pos >= share:
            yield _slice(cut, meta, span, first, unit, pos, bpos - pos)
            first, pos = unit, bpos
    yield _slice(cut, meta, span, first, p.hi, pos, max(span.end_est - pos, 1))


def _pack(slices: list[Slice], share: int) -> list[list[Slice]]:
    bins: list[list[Slice]] = []
    cur: list[Slice] = []
    size = 0
    for sl in slices:
        if cur and size + sl.size > share:
            bins.append(cur)
            cur, size = [], 0
        cur.append(sl)
        size += sl.size
    if cur:
        bins.append(cur)
    return bins


def cap_by_bytes(
    cut: Cut,
    meta: MetaReader,
    path: str,
    a: int,
    b: int,
    budget: int,
    forks: str,
    *,
    must_progress: bool,
) -> tuple[int, int]:
    """The end unit (a record boundary) that keeps ``[a, end)`` within ``budget`` bytes.

    Returns (end unit, estimated bytes). Boundaries come from the index (about
    one per 16 KiB), so a trigger may stop up to one granule short of its
    budget. With ``must_progress`` at least one boundary past ``a`` is taken
    even if it exceeds the budget: a trigger that admits nothing would never
    finish an availableNow run.
    """
    used = 0
    end = a
    for piece in pieces_for(cut, path, a, b, forks):
        span = _span(meta, path, piece)
        if used + span.size <= budget:
            used += span.size
            end = piece.hi
            continue
        best: tuple[int, int] | None = None
        for unit, bpos in meta.boundaries(piece.owner, piece.lo, piece.hi):
            if used + (bpos - span.pos) > budget:
                if best is None and must_progress and end == a:
                    best = (unit, bpos)
                break
            best = (unit, bpos)
        if best is not None:
            return best[0], used + best[1] - span.pos
        if must_progress and end == a:
            return piece.hi, used + span.size
        return end, used
    return end, used
