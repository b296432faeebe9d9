"""The record index: where to start scanning a segment file to find a unit.

The ``index`` database holds an entry (stream id, unit) -> file position at
least every 16 KiB of segment file, each at a record start. To find unit
``u``, take the last entry at or below ``u`` and scan forward from there; with
no entry, scan from the file's first record (or, once retention dropped the
head of the log, from the retained start: entries below it may linger).
"""

from __future__ import annotations

from typing import Any

from stream_format.meta import INDEX_KEY, U64, id_key, index_key
from stream_format.records import FILE_HEADER_SIZE


def floor(
    txn: Any,
    db: Any,
    stream_id: int,
    unit: int | None,
    base: int,
    *,
    max_pos: int | None = None,
    first: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """(file position, unit) of the last indexed record start at or before ``unit``
    (any unit when None) and at or below ``max_pos``; else the file's first record,
    which starts at unit ``base``. ``txn`` is an LMDB read transaction.

    ``first`` is the retained start (file position, unit) when retention has
    dropped the head of the log (format 4): the bytes below it are holes, so
    an entry below it is never returned and the start stands in for it.
    """
    lowest = first if first is not None else (FILE_HEADER_SIZE, base)
    prefix = id_key(stream_id)
    target = index_key(stream_id, unit + 1) if unit is not None else index_key(stream_id + 1, 0)
    cur = txn.cursor(db=db)
    found = cur.prev() if cur.set_range(target) else cur.last()
    while found and cur.key()[:8] == prefix:
        _, idx_unit = INDEX_KEY.unpack(cur.key())
        pos = U64.unpack(cur.value())[0]
        if pos < lowest[0]:
            break
        if max_pos is None or pos <= max_pos:
            return pos, idx_unit
        found = cur.prev()
    return lowest
