"""Where the archive ends along a term history, and how one batch is put there.

The archive may hold frames of terms this replica's history left (a deposed
primary's last frames past the lsn its successor's term began at): only
frames along our history count, each term's from its first lsn up to the next
term's first lsn - 1 (``stream_format.archive.history_ranges``). Each term's
last object (names sort by first lsn) says, by its header, how far that term
is archived.

A put is conditional (``If-None-Match: *``). On 412 an object of that name is
there already: the same frames (frames of one term at one lsn are the same
whoever uploaded them), perhaps more or fewer; its header's last lsn says
where to continue. No gap, no lsn twice.
"""

from __future__ import annotations

from stream_format.archive import (
    HEADER_SIZE,
    WAL_PREFIX,
    ArchivedFrame,
    History,
    decode_header,
    encode_frames_object,
    encode_history,
    history_name,
    history_ranges,
    parse_wal_name,
    wal_name,
)
from stream_server.archive.object_store import ObjectStore

NO_END = (1 << 63) - 1


def with_term(history: History, term: int | None, lsn: int) -> History:
    """A primary's history with its own term in it from the start: a new primary's
    term enters its replica history with its first frame (``ReplicaHooks.stamp``), at
    the lsn after ``lsn``; until then the archive's end is read along the history it
    will have, not along the old term's (whose deposed primary may have archived
    past where this term begins). ``term`` None: not the primary."""
    if term is None or (history and history[-1][0] >= term):
        return history
    return [*history, (term, lsn + 1)]


def term_end(history: History, term: int) -> int:
    """The last lsn of ``term`` along ``history`` (NO_END for the newest)."""
    for i, (t, _) in enumerate(history):
        if t == term:
            return history[i + 1][1] - 1 if i + 1 < len(history) else NO_END
    return 0


def archived_end(store: ObjectStore, history: History) -> tuple[int, int]:
    """(lsn, term) of the last frame the archive holds along ``history``; (0, first
    term) for an archive with none."""
    end = (0, history[0][0])
    for term, first, last in history_ranges(history, NO_END):
        names = [n for n, _ in store.objects(f"{WAL_PREFIX}{term:016x}-")]
        starts = [(parse_wal_name(n)[1], n) for n in names]
        inside = [(s, n) for s, n in starts if first <= s <= last or s < first]
        if not inside:
            continue
        _, name = max(inside)
        _, _, held, _, _ = decode_header(name, store.get_range(name, 0, HEADER_SIZE))
        if held >= first:
            end = max(end, (min(held, last), term))
    return end


def put_history(store: ObjectStore, history: History, term: int) -> None:
    """``history/<term>.json``: the ancestry of ``term`` (written once, by whoever is
    first)."""
    upto = [(t, f) for t, f in history[: [t for t, _ in history].index(term) + 1]]
    store.put_new(history_name(term), encode_history(term, upto))


def put_frames(store: ObjectStore, term: int, frames: list[ArchivedFrame]) -> int:
    """Upload ``frames`` (one term, consecutive) as one object; the last lsn the
    archive now holds from the first of them on (another's, on 412)."""
    name = wal_name(term, frames[0].lsn)
    if store.put_new(name, encode_frames_object(term, frames)):
        return frames[-1].lsn
    _, _, held, _, _ = decode_header(name, store.get_range(name, 0, HEADER_SIZE))
    return held
