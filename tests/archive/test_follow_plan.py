"""Which archived frames a replica cluster's server takes next (``archive/follow/follow_plan.py``)
and the term it writes under once promoted (``archive/follow_position.py``): pure."""

from __future__ import annotations

import pytest

from stream_format.archive import ArchivedFrame, wal_name
from stream_server.archive.follow.follow_plan import (
    Diverged,
    Next,
    check_taken,
    frames_wanted,
    next_frames,
    objects_to_read,
    restored_history,
)
from stream_server.archive.follow_position import Followed, promoted_history

HISTORY = [(0, 1), (3, 10), (5, 20)]


@pytest.mark.parametrize(
    ("applied", "want"),
    [
        (0, Next(0, 1, 9)),
        (8, Next(0, 9, 9)),
        (9, Next(3, 10, 19)),
        (19, Next(5, 20, None)),
        (100, Next(5, 101, None)),
    ],
)
def test_the_next_frame_comes_from_the_term_holding_it(applied: int, want: Next) -> None:
    assert next_frames(HISTORY, applied) == want


def test_a_history_that_begins_later_does_not_reach_lsn_1() -> None:
    assert next_frames([(2, 50)], 0) is None


def test_frames_taken_along_another_history_have_diverged() -> None:
    check_taken([(0, 1)], HISTORY, 9)  # term 0 up to 9: on the history
    check_taken([(0, 1), (3, 10)], HISTORY, 15)
    with pytest.raises(Diverged, match="rebuilt from a base backup"):
        check_taken([(0, 1)], HISTORY, 10)  # frame 10 taken from term 0: a deposed one's
    with pytest.raises(Diverged):
        check_taken([(0, 1), (4, 10)], HISTORY, 12)


def test_a_restore_took_its_frames_along_the_history_up_to_its_last_term() -> None:
    assert restored_history(HISTORY, 3) == [(0, 1), (3, 10)]
    check_taken(restored_history(HISTORY, 3), HISTORY, 15)  # then followed from 16 on
    # A term begun at or before the last lsn restored (read after the restore): the
    # frames restored past its start were a deposed primary's.
    with pytest.raises(Diverged):
        check_taken(restored_history(HISTORY, 3), HISTORY, 21)
    with pytest.raises(Diverged):
        check_taken(restored_history(HISTORY, 4), HISTORY, 5)  # a term it does not name


def test_objects_chosen_hold_the_wanted_frames_only() -> None:
    names = [wal_name(3, 10), wal_name(3, 14), wal_name(3, 18), wal_name(3, 25)]
    assert objects_to_read(names, Next(3, 15, 19)) == [wal_name(3, 14), wal_name(3, 18)]
    assert objects_to_read(names, Next(3, 10, 19)) == names[:3]
    assert objects_to_read(names, Next(3, 26, None)) == [wal_name(3, 25)]
    assert objects_to_read([wal_name(2, 1)], Next(3, 10, None)) == []


def frames(first: int, last: int) -> list[ArchivedFrame]:
    return [ArchivedFrame(lsn, lsn, b"") for lsn in range(first, last + 1)]


def test_frames_wanted_cut_to_the_term_and_refuse_a_gap() -> None:
    got = frames_wanted(frames(5, 12), Next(3, 8, 10), 7)
    assert [f.lsn for f in got] == [8, 9, 10]
    assert frames_wanted(frames(1, 4), Next(3, 8, 10), 7) == []
    with pytest.raises(ValueError, match="no frame 8"):
        frames_wanted(frames(9, 12), Next(3, 8, None), 7)


def test_a_promotion_takes_the_term_above_every_term_the_source_named() -> None:
    single = Followed("s3://b", 7, [(0, 1)], 0)
    assert promoted_history(single) == (1, [(0, 1), (1, 8)])
    # The source had moved on to term 6 (its history read), this one applied up to 15
    # of term 3: the new term is 7, from 16, after the terms its frames came from.
    behind = Followed("s3://b", 15, [(0, 1), (3, 10)], 6)
    assert promoted_history(behind) == (7, [(0, 1), (3, 10), (7, 16)])
