"""Retention's part of the engine alone (``engine/head_drops.py``), over the log reader
of a data directory an engine wrote: where a drop may move a start, the index entries
it makes useless, and the blocks it gives back once durable."""

from __future__ import annotations

import os
from pathlib import Path

from stream_format.layout import Layout
from stream_format.meta import index_key
from stream_format.records import FILE_HEADER_SIZE, RECORD_HEADER_SIZE
from stream_server.engine.head_drops import HeadDrops
from stream_server.engine.log_reads import LogReads
from stream_server.engine.metadata import Metadata
from stream_server.engine.ops import DropHead
from stream_server.engine.segments import Segments
from testkit.engines import file_and_inline

RECORD = 10_000  # bytes per record: a few file system blocks each


def at(k: int) -> int:
    """The file position of stream 1's record ``k`` (0-based)."""
    return FILE_HEADER_SIZE + k * (RECORD_HEADER_SIZE + RECORD)


def drops_over(root: Path) -> tuple[HeadDrops, list[str]]:
    """Stream 1 (a file): four records of ``RECORD`` bytes; stream 2: inline. The drops
    part over a reader of it, and the stages its hook heard."""
    e = file_and_inline(root, RECORD, [b"1"])
    tails = dict(e.tails)
    e.close()
    segments = Segments(Layout(root))
    segments.meta = Metadata(Layout(root).meta, 1 << 30)
    segments.inline = {2}
    stages: list[str] = []
    return HeadDrops(LogReads(segments, tails), stages.append), stages


def test_a_drop_moves_to_the_first_record_at_or_past_the_position_never_past_the_tail(
    tmp_path,
):
    drops, _ = drops_over(tmp_path)
    every = 4 * RECORD
    assert drops.retention_point(1, min_pos=at(1) + 1, cutoff_us=None, max_unit=every) == (
        2 * RECORD,
        at(2),
    )
    assert drops.retention_point(1, min_pos=at(1) + 1, cutoff_us=None, max_unit=2 * RECORD - 1) == (
        RECORD,
        at(1),
    )  # the record that would pass the tail the caller saw stays
    assert drops.retention_point(1, min_pos=0, cutoff_us=None, max_unit=every) is None
    assert drops.retention_point(1, min_pos=at(2), cutoff_us=2**62, max_unit=every) == (
        every,
        at(4),
    )  # nothing committed that late: everything may go
    assert drops.first_record_time(1) is not None and drops.first_record_time(1)[0] == at(0)


def test_a_drop_names_the_index_entries_below_its_new_start(tmp_path):
    drops, _ = drops_over(tmp_path)
    drop = DropHead(1, 3 * RECORD, at(3))
    drops.resolve([drop])
    assert drop.index_keys and all(k < index_key(1, 3 * RECORD) for k in drop.index_keys)
    drops.reads.tails[1].start = 4 * RECORD  # as if a later drop had moved it further
    behind = DropHead(1, 3 * RECORD, at(3))
    drops.resolve([behind])
    assert behind.index_keys == []  # the start does not move: nothing to delete


def test_a_punch_gives_the_blocks_below_a_durable_start_back_once(tmp_path):
    drops, stages = drops_over(tmp_path)
    path = drops.reads.segments.path(1)
    before = os.stat(path).st_blocks
    assert drops.punch(1, at(3))  # some blocks went: the file needs a flush
    assert os.stat(path).st_blocks < before and drops.reclaimed_bytes > 0
    assert stages == ["punch"]
    reclaimed = drops.reclaimed_bytes
    assert not drops.punch(1, at(3))  # nothing new below the same start
    assert drops.reclaimed_bytes == reclaimed
    assert not drops.punch(2, 4096) and stages == ["punch", "punch"]  # inline: none
