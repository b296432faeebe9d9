"""Which frames make the next frames object (archive/upload/uploads.py), in-process."""

from __future__ import annotations

import time

from stream_format.archive import ArchivedFrame
from stream_format.wal import encode_frame
from stream_server.archive.upload.uploads import Batch
from stream_server.archive.upload.wal_source import Read
from stream_server.declared.groups import ArchiveSettings

HISTORY = [(1, 1), (2, 6)]  # term 2 began at lsn 6


def reads(lsns: list[int], age: float = 0.0) -> list[Read]:
    now = int((time.time() - age) * 1e6)
    return [Read(ArchivedFrame(n, now, encode_frame(n, [])), 1, 100 * n) for n in lsns]


def batch(object_bytes: int = 1 << 20, timeout: float = 60.0, required: bool = False) -> Batch:
    mode = "required" if required else "async"
    return Batch(
        ArchiveSettings(
            archive_timeout=timeout, archive_object_bytes=object_bytes, archive_mode=mode
        )
    )


def lsns(group: tuple[int, list[Read]] | None) -> tuple[int, list[int]] | None:
    return None if group is None else (group[0], [r.frame.lsn for r in group[1]])


def test_young_small_frames_wait_for_the_timeout() -> None:
    b = batch()
    b.add(reads([1, 2, 3]), archived=0, history=HISTORY)
    assert b.due() is None
    assert 0 < b.wait() <= 60
    assert lsns(b.due(hurry=True)) == (1, [1, 2, 3])


def test_old_frames_and_required_mode_are_due_at_once() -> None:
    old = batch(timeout=1.0)
    old.add(reads([1, 2], age=5.0), archived=0, history=HISTORY)
    assert lsns(old.due()) == (1, [1, 2])
    required = batch(required=True)
    required.add(reads([1]), archived=0, history=HISTORY)
    assert lsns(required.due()) == (1, [1])


def test_a_group_ends_at_a_term_change_a_gap_or_the_object_size() -> None:
    b = batch()
    b.add(reads([4, 5, 6, 7]), archived=3, history=HISTORY)
    assert lsns(b.due()) == (1, [4, 5])  # term 1 ends at 5: due, more follow
    b.drop(5)
    assert lsns(b.due(hurry=True)) == (2, [6, 7])
    gap = batch()
    gap.add(reads([1, 2, 9]), archived=0, history=HISTORY)
    assert lsns(gap.due()) == (1, [1, 2])
    size = len(encode_frame(1, []))
    full = batch(object_bytes=2 * size)
    full.add(reads([1, 2, 3]), archived=0, history=HISTORY)
    assert lsns(full.due()) == (1, [1, 2])


def test_frames_the_archive_holds_are_not_taken_and_dropped_once_held() -> None:
    b = batch()
    b.add(reads([1, 2, 3, 4]), archived=2, history=HISTORY)
    assert [r.frame.lsn for r in b.reads] == [3, 4]
    b.drop(4)  # another archiver's object held them (a 412)
    assert not b.reads and b.size == 0 and b.due() is None
