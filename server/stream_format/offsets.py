"""Offset tokens: fixed width, so that byte-wise order is stream order.

A token is ``GGGGGGGGGGGGGGGG_UUUUUUUUUUUUUUUU``: a reserved 16-digit field
(always zero in format 1; room for re-basing streams later) and the 16-digit
unit position (a byte for binary streams, a message for JSON streams).
``-1`` and ``now`` are sentinels and never minted.
"""

from __future__ import annotations

import re

START = -1
NOW = -2

_TOKEN = re.compile(r"\A(\d{16})_(\d{16})\Z")


class OffsetError(ValueError):
    pass


def format_offset(unit: int) -> str:
    return f"0000000000000000_{unit:016d}"


def parse_offset(value: str, *, allow_now: bool = True) -> int:
    """A unit position, or START / NOW for the sentinels."""
    if value == "-1":
        return START
    if value == "now":
        if not allow_now:
            raise OffsetError("offset 'now' is not valid here")
        return NOW
    m = _TOKEN.match(value)
    if m is None or m.group(1) != "0000000000000000":
        raise OffsetError(f"malformed offset {value[:80]!r}")
    return int(m.group(2))
