"""Forks: a stream that starts as a prefix of another and copies nothing.

A fork records its source and the unit it forks at (``fork_from``,
``fork_offset``); a read of the fork stitches the source's units below that
point to its own (``chain``). A source counts its forks (``refcount``):
deleting a source that forks still read through only marks it deleted (410
from then on), and the deletion of its last fork removes it too, which may
cascade up a chain of deleted sources (``queue_delete``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import NamedTuple

from stream_format.meta import StreamMeta
from stream_server.engine.ops import DeleteStream, DropLog, Op, PutStream
from stream_server.streams.errors import BadRequest, Conflict, NotFound
from stream_server.streams.model import Stream
from stream_server.streams.pending import StreamTable
from stream_server.streams.requests import ForkRequest


class Piece(NamedTuple):
    """Units ``lo`` up to ``hi`` of a stitched stream, held in ``owner``'s log."""

    owner: Stream
    lo: int
    hi: int


def chain(table: StreamTable, s: Stream, hi: int) -> list[Piece]:
    """The pieces that make up ``s`` below ``hi``, oldest source first."""
    pieces: list[Piece] = []
    cur: Stream | None = s
    while cur is not None:
        lo = cur.meta.fork_offset
        pieces.append(Piece(cur, lo, hi))
        hi = min(hi, lo)
        parent = cur.meta.fork_from
        cur = None
        if parent is not None and hi > 0:
            cur = table.find(parent)
    pieces.reverse()
    return pieces


def fork_depth(table: StreamTable, s: Stream) -> int:
    """How many forks lie between ``s`` and its root stream (0 for a root)."""
    depth = 0
    parent = s.pending.meta.fork_from
    while parent is not None:
        depth += 1
        up = table.find(parent)
        parent = up.pending.meta.fork_from if up is not None else None
    return depth


def fork_source(
    table: StreamTable,
    f: ForkRequest,
    *,
    max_depth: int,
    expire: Callable[[Stream], None],
    now: float,
) -> Stream:
    """The stream ``f`` forks from, if a fork of it may be created now."""
    src = table.get(f.source)
    if src is None or not src.committed:
        raise NotFound("fork source stream not found")
    if src.pending.meta.soft_deleted:
        raise Conflict("fork source stream was deleted")
    if src.expired(now):
        expire(src)
        raise NotFound("fork source stream not found (expired)")
    if fork_depth(table, src) >= max_depth:
        raise BadRequest(f"fork chain too deep: at most {max_depth} forks below a root")
    return src


def fork_point(src: Stream, f: ForkRequest, boundary: int | None) -> int:
    """The unit of ``src`` the fork starts at.

    A sub-offset moves the point that many units past the offset, within the
    next record: for JSON streams a unit is one message; otherwise one payload
    byte, and the point may not pass the end of the data that begins at the
    offset (``boundary``, read from the log before validation began).
    """
    unit = src.tail if f.offset is None else f.offset
    if unit > src.tail or unit < 0:
        raise BadRequest("fork offset is beyond the source stream's tail")
    if not f.sub_offset:
        return unit
    target = unit + f.sub_offset
    if target > src.tail:
        raise BadRequest("fork sub-offset is past the end of the source stream")
    if src.is_json:
        return target
    if boundary is None:
        raise Conflict("the fork source changed while the fork was being created; retry")
    if target > boundary:
        raise BadRequest("fork sub-offset is past the next data boundary")
    return target


async def sub_offset_boundary(
    table: StreamTable,
    fork: ForkRequest | None,
    record_end: Callable[[int, int], Awaitable[int]],
) -> int | None:
    """End unit of the source record a binary sub-offset fork starts in.

    ``record_end(stream id, unit)`` reads it from the log; this runs before
    validation so that validation itself never waits on the disk.
    """
    if fork is None or not fork.sub_offset or fork.offset is None:
        return None
    src = table.get(fork.source)
    if src is None or not src.committed or src.is_json:
        return None
    for owner, lo, hi in chain(table, src, src.tail):
        if lo <= fork.offset < hi:
            end = await record_end(owner.id, fork.offset)
            return min(end, hi)
    return fork.offset


def matches_fork(fork: ForkRequest | None, m: StreamMeta) -> bool:
    """Whether a repeated create asks for the fork the existing stream ``m`` is."""
    if fork is None:
        return m.fork_from is None
    if fork.source != m.fork_from:
        return False
    return fork.offset is None or m.fork_offset == fork.offset + fork.sub_offset


def queue_reference(source: Stream) -> tuple[Op, Callable[[], None]]:
    """The op and commit action that count one more fork of ``source``."""
    source.pending.meta.refcount += 1
    src_meta = replace(source.pending.meta)

    def apply() -> None:
        source.meta.refcount = src_meta.refcount

    return PutStream(source.path, replace(src_meta)), apply


def queue_delete(
    table: StreamTable, s: Stream, announce: Callable[[str], None]
) -> tuple[list[Op], Callable[[], None]]:
    """Ops and commit action that delete ``s``: soft if forks read through it.

    ``announce(path)`` runs for each stream that is gone once the batch is durable.
    """
    if s.pending.meta.refcount > 0:
        s.pending.meta.soft_deleted = True
        meta = replace(s.pending.meta)

        def apply_soft() -> None:
            s.meta = meta
            s.notify()
            announce(s.path)

        return [PutStream(s.path, replace(meta))], apply_soft
    ops: list[Op] = []
    gone: list[Stream] = []
    updated: list[tuple[Stream, StreamMeta]] = []
    cur: Stream | None = s
    while cur is not None:
        ops += [DeleteStream(cur.path), DropLog(cur.id)]
        gone.append(cur)
        table.queue_delete(cur)
        parent_path = cur.pending.meta.fork_from
        cur = None
        if parent_path is not None:
            parent = table.find(parent_path)
            if parent is not None:
                parent.pending.meta.refcount -= 1
                if parent.pending.meta.refcount <= 0 and parent.pending.meta.soft_deleted:
                    cur = parent  # cascade: the last fork of a deleted stream is gone
                else:
                    meta = replace(parent.pending.meta)
                    ops.append(PutStream(parent.path, replace(meta)))
                    updated.append((parent, meta))

    def apply() -> None:
        for g in gone:
            table.delete_durable(g)
            g.notify()
            announce(g.path)
        for parent, meta in updated:
            parent.meta.refcount = meta.refcount

    return ops, apply
