"""Which archived frames a follower takes next, along the source's term histories.

Pure: the follower (``replica_cluster.py``) lists and downloads; this decides. The
source's newest term history (``history/<term>.json``, PostgreSQL's timeline
history) says, for each term, from which lsn its frames are the source's
history: frames of an older term at or past the next term's first lsn were
never acknowledged there (a deposed primary's) and are skipped. A follower
that has applied such a frame has left the source's history: it stops and
says so, as a standby whose history left its primary's must be re-copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_format.archive import ArchivedFrame, History, history_ranges, parse_wal_name


class Diverged(Exception):
    """The frames applied here are not on the source's history any more."""


@dataclass(frozen=True)
class Next:
    """The frames to take next: ``term``'s, from ``first`` to ``last`` (None: the
    newest term, no end yet)."""

    term: int
    first: int
    last: int | None


def next_frames(history: History, applied: int) -> Next | None:
    """Where the frame after ``applied`` comes from along ``history``; None when the
    history does not reach it (no term began at or before it)."""
    want = applied + 1
    for i, (term, first) in enumerate(history):
        end = history[i + 1][1] - 1 if i + 1 < len(history) else None
        if first <= want and (end is None or want <= end):
            return Next(term, want, end)
    return None


def check_taken(taken: History, history: History, applied: int) -> None:
    """Diverged unless the frames applied (taken along ``taken``, up to ``applied``) are
    the ones ``history`` names: the same term for every lsn."""
    if not taken or applied == 0:
        return
    mine = history_ranges(taken, applied)
    theirs = history_ranges(history, applied)
    if mine != theirs:
        raise Diverged(
            f"the frames applied here up to lsn {applied} were taken along {mine}, but the "
            f"source's history is {theirs}: this replica must be rebuilt from a base backup"
        )


def restored_history(history: History, term: int) -> History:
    """The terms a restore took its frames along, given ``history`` (the archive's newest,
    read once the restore finished) and ``term`` (the term of the last frame it restored,
    or of its backup): every entry of ``history`` up to ``term``'s own.

    The restore read a history no newer than ``history``, which extends it by terms begun
    since; so when a newer term began at or before the last lsn restored, the restored
    frames past that point were a deposed primary's, and ``check_taken`` says so. A term
    the history does not name (an archive rewritten under us) makes a history that
    diverges from the first frame."""
    terms = [t for t, _ in history]
    if term not in terms:
        return [(term, 1)]
    return list(history[: terms.index(term) + 1])


def objects_to_read(names: list[str], want: Next) -> list[str]:
    """Of ``names`` (frames objects of ``want.term``, in name order, so by first lsn),
    those that may hold frames from ``want.first`` on: the last one starting at or
    before it, and every later one starting within the term's range."""
    chosen: list[str] = []
    for name in names:
        term, first = parse_wal_name(name)
        if term != want.term or (want.last is not None and first > want.last):
            continue
        if first <= want.first:
            chosen = [name]  # an earlier start holds nothing a later one does not
        else:
            chosen.append(name)
    return chosen


def frames_wanted(frames: list[ArchivedFrame], want: Next, applied: int) -> list[ArchivedFrame]:
    """The frames of one object to apply after ``applied``, within ``want``'s range;
    ValueError when they leave a gap after ``applied``."""
    kept = [
        f
        for f in frames
        if f.lsn > applied and (want.last is None or f.lsn <= want.last) and f.lsn >= want.first
    ]
    if kept and kept[0].lsn != applied + 1:
        raise ValueError(
            f"the archive holds no frame {applied + 1} of term {want.term}: its next frame "
            f"there is {kept[0].lsn}"
        )
    return kept
