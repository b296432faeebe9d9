"""What the engine shares with a replica set: the hooks it calls on its commit path,
and the pure steps of applying frames another engine made.

The engine applies a primary's frames itself (``Engine.append_frames``,
``Engine.commit_frames``), through the same publish step as its own batches;
what is pure in that (splitting frames into record writes and metadata,
joining each stream's adjacent writes, and reading from the ``tails`` changes
what publishing them does) lives here, so that it is tested on its own and the
engine module keeps to the commit path. ``ReplicaRole`` is how the engine
knows ``engine/replica.py``, which builds on the engine: a protocol, so that
the import runs one way only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from stream_format import wal as walmod
from stream_format.meta import DB_TAILS, decode_tail, key_stream_id
from stream_server.engine.batch import Batch, Tail


class ReplicaRole(Protocol):
    """What a replica set adds to the commit path (``engine/replica.py``'s
    ``ReplicaHooks``). A protocol, so that the engine does not import the module that
    builds on it: replica.py drives the engine through its public methods only."""

    term: int  # the term this replica writes under while primary

    def check_writable(self) -> None:
        """StorageError unless this replica may write batches of its own (a primary)."""
        ...

    def stamp(self, batch: Batch, lsn: int) -> None:
        """Add the replica position to the batch's metadata, before its frame is made."""
        ...

    def committed(self, lsn: int, frame: bytes) -> None:
        """The batch's frame is durable here (before its LMDB commit): ship it."""
        ...

    def replayed(self, lsn: int, changes: list[walmod.Entry], frame: memoryview) -> None:
        """Recovery replayed this frame from the WAL."""
        ...


@dataclass(slots=True)
class AppendedFrames:
    """Frames from a primary durable in the WAL, their metadata not yet in LMDB
    (``Engine.append_frames``; ``Engine.commit_frames`` finishes them)."""

    frames: list[tuple[int, list[walmod.Entry]]]  # lsn, metadata changes, in order
    streams: set[int]  # the streams whose segment files they wrote


def coalesced(writes: Iterable[walmod.Entry]) -> Iterator[tuple[int, int, bytes]]:
    """Frames' record writes as (stream id, position, bytes), each stream's adjacent
    writes joined into one: a fetch answer holds many batches, and a stream appended
    to in several of them is written with one pwrite instead of one each. Writes to
    one stream keep their order; different streams are different files."""
    runs: dict[int, tuple[int, list[bytes | memoryview]]] = {}  # sid -> start, parts
    ends: dict[int, int] = {}
    for _, sid, pos, data in writes:
        run = runs.get(sid)
        if run is not None and ends[sid] == pos:
            run[1].append(data)
        else:
            if run is not None:
                yield sid, run[0], b"".join(run[1])
            runs[sid] = (pos, [data])
        ends[sid] = pos + len(data)
    for sid, (start, parts) in runs.items():
        yield sid, start, b"".join(parts)


def split_frames(
    frames: Iterable[bytes],
) -> tuple[list[tuple[int, list[walmod.Entry]]], list[walmod.Entry]]:
    """Whole frames as (lsn, metadata changes) each, and all their record writes in
    order. ValueError for a damaged frame (a peer's bytes: refused, never replayed)."""
    decoded: list[tuple[int, list[walmod.Entry]]] = []
    writes: list[walmod.Entry] = []
    for frame in frames:
        try:
            lsn, entries = walmod.decode_frame(frame)
        except walmod.WalCorrupt as exc:
            raise ValueError(str(exc)) from None
        decoded.append((lsn, [e for e in entries if e[0] != walmod.WRITE]))
        writes.extend(e for e in entries if e[0] == walmod.WRITE)
    return decoded, writes


@dataclass(slots=True)
class TailEffects:
    """What publishing frames does (the arguments of the engine's publish step)."""

    tails: dict[int, Tail] = field(default_factory=dict)  # the new tails
    dropped: list[int] = field(default_factory=list)  # streams whose files go
    heads: dict[int, int] = field(default_factory=dict)  # retained starts moved forward


def tail_effects(
    frames: Iterable[tuple[int, list[walmod.Entry]]], tails: Mapping[int, Tail]
) -> TailEffects:
    """Read from the frames' ``tails`` changes, in order, on streams now at ``tails``:
    each new tail, a retained start moved forward (its blocks are punched), or a
    stream's data dropped (its file removed). A batch of the engine's own knows these
    from its operations (``batch.build``); frames from a primary carry only the
    values."""
    effects = TailEffects()
    for _, changes in frames:
        for entry in changes:
            if entry[1] != DB_TAILS:
                continue
            sid = key_stream_id(entry[2])
            if entry[0] == walmod.PUT:
                tail = Tail(*decode_tail(entry[3]))
                old = effects.tails.get(sid) or tails.get(sid)
                if old is not None and tail.start_pos > old.start_pos:
                    effects.heads[sid] = tail.start_pos
                effects.tails[sid] = tail
            elif entry[0] == walmod.DELETE:
                effects.heads.pop(sid, None)
                if effects.tails.pop(sid, None) is not None or sid in tails:
                    effects.dropped.append(sid)
    return effects
