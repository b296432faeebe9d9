"""Fork chains: which stream's segment file holds which units of a stream.

A fork holds its own units from its fork offset on and reads lower units
through its source, which may itself be a fork. The server's reads and the
Spark reader stitch streams with this one rule, so they can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar


class Forkable(Protocol):
    @property
    def fork_from(self) -> str | None: ...

    @property
    def fork_offset(self) -> int: ...


T = TypeVar("T")


class BrokenChain(Exception):
    """A fork's source is missing."""


def pieces(
    top: T, lo: int, hi: int, meta: Callable[[T], Forkable], source: Callable[[str], T | None]
) -> list[tuple[T, int, int]]:
    """The ``(stream, from unit, to unit)`` pieces that make up ``top`` in ``[lo, hi)``,
    oldest first; each piece is read from that stream's own segment file.

    ``meta`` gives a stream's fork fields; ``source`` finds a stream by path.
    """
    out: list[tuple[T, int, int]] = []
    cur: T | None = top
    while cur is not None and hi > lo:
        m = meta(cur)
        own_lo = m.fork_offset
        a = max(own_lo, lo)
        if a < hi:
            out.append((cur, a, hi))
        hi = min(hi, own_lo)
        parent = m.fork_from
        cur = None
        if parent is not None and hi > lo:
            cur = source(parent)
            if cur is None:
                raise BrokenChain(f"fork source {parent!r} is missing")
    out.reverse()
    return out
