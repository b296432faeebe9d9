"""The engine's side of replication: what a replica set needs from the commit path.

It holds every LMDB key a replica set adds to the engine's data (position,
term history, a standby's applied frames, a set's base and a member's
leaving) with the code that writes them: the on-disk half of the safety
argument reads one module. It drives the engine through its public methods
only; the engine knows it as a ``ReplicaRole`` (engine.py) and never imports it.

- ``ReplicaHooks.stamp`` puts the replica position (term, lsn) into every
  batch's metadata, so that it is in the WAL frame and in LMDB in the same
  commit: the position survives a restart with the data it describes, and a
  standby that applies the frame holds the same position. Each term's first
  frame also records the term's first lsn (the term history, KIP-101's leader
  epoch cache), from which a primary tells where a follower's history left
  its own.
- ``ReplicaHooks.replayed`` keeps the frames recovery replays from the WAL
  after a crash, with their terms: the shipper starts from them.
- ``ReplicaHooks.committed`` sees each batch's WAL frame bytes, with its term
  and lsn, once durable locally: as soon as the WAL is flushed, before the
  LMDB commit, so that the standbys' apply overlaps it (the primary ships
  them). A shipped frame cannot be taken back: when the LMDB commit after it
  fails, ``Engine.commit`` fails the replica closed instead of undoing the
  frame (a single node undoes it), and the replica gives up the Lease.
- While ``writable`` is False (a standby) ``Engine.commit`` refuses every
  batch: only frames from the primary are written, so a standby never makes
  history of its own (an expiry sweep on a standby fails instead of diverging).
- Frames received from the primary go through the engine's public frame path
  (``Engine.append_frames``, ``Engine.commit_frames``): segment files, the WAL
  (the frame as it came, same lsn), fdatasync, LMDB, then the same publish step
  as a batch of the primary's own; the frames of one stream read as one group
  (one write per stream, one WAL write and flush, one LMDB transaction). It is
  two halves: ``write_frames`` makes the frames durable (the WAL flushed: the
  standby's durable position moves, and it may tell the primary),
  ``commit_frames`` writes LMDB and the tails, so that a standby's
  acknowledgement need not wait for its LMDB commit. This module adds only
  what a replica set keeps beside the frames: the positions.

None of this exists in single-node mode: ``Engine.replica`` is None there. A
single-node start on a set member's directory makes it leave the set first
(``leave_set``), so that what it then writes is never taken for the set's.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from stream_format import wal as walmod
from stream_format.meta import (
    DB_INFO,
    DB_RECORDS,
    DB_STREAMS,
    KEY_NEXT_STREAM_ID,
)
from stream_server.engine.batch import Batch
from stream_server.engine.data_dir import remove_set_id
from stream_server.engine.engine import Engine
from stream_server.engine.frames import AppendedFrames
from stream_server.engine.prior_tails import Prior, prior_tails
from stream_server.engine.storage_errors import StorageError

log = logging.getLogger("stream_server.engine")

KEY_POSITION = b"replica_position"  # DB_INFO: (term, lsn) of the last batch, "<QQ"
KEY_TERMS = b"replica_terms"  # DB_INFO: JSON [[term, first lsn], ...], oldest first
# DB_INFO: JSON {"set": id or "", "position": [term, lsn] or null}: the set this
# directory left when a single node started on it (``leave_set``)
KEY_LEFT = b"replica_left"
# DB_INFO, written by a replica cluster's server (archive/follow_position.py): what it
# followed (JSON with the source's highest term) and, once promoted, its own term. Read
# here only for the term a new Lease starts at (``term_floor``).
KEY_FOLLOWED = b"archive_followed"
KEY_SINGLE_NODE_TERM = b"archive_term"
POSITION = struct.Struct("<QQ")

Position = tuple[int, int]


class NotReplicated(StorageError):
    """A batch durable here but not acknowledged: too few replicas have it, or this
    replica is no longer the primary. The client is told 503 and retries."""


class AckGate(Protocol):
    """What the commit pipeline awaits before a batch's waiters hear of it."""

    wait_seconds: float  # how long a batch's waiters wait at the gate before ``overdue``

    async def wait(self, lsn: int, late: Callable[[StorageError], None]) -> bool:
        """True once the batch at ``lsn`` may be acknowledged and published; False
        when it never will be (this replica is no longer the primary), after calling
        ``late`` with the error for its waiters."""
        ...

    def overdue(self) -> StorageError:
        """The error for the waiters of a batch still at the gate ``wait_seconds``
        after it got there (its outcome is unknown: it may still be published)."""
        ...


class ReplicaHooks:
    """Attached to an ``Engine`` (``engine.replica``) in a replica set only."""

    def __init__(self, on_frame: Callable[[int, int, bytes], None] | None = None) -> None:
        self.writable = False  # a standby until the role loop says otherwise
        self.term = 0  # the term this replica writes under while primary
        self.terms: list[tuple[int, int]] = []  # (term, first lsn), oldest first
        self.durable: Position = (0, 0)
        # Told of each batch's frame (term, lsn, frame) once durable, on the writer
        # thread: the primary's shipper.
        self.on_frame = on_frame
        # The frames recovery replayed from the WAL, as (term, lsn, frame), for the
        # shipper to start from (``replayed``).
        self.recovered: list[tuple[int, int, bytes]] = []
        # The set this directory left (``leave_set``), None when it left none: a set
        # id file naming it is a leftover of the leave, not a membership.
        self.left: str | None = None
        # The highest term this directory's data names anywhere (its position, its term
        # history, the set it left, an archive it followed or was promoted from): a Lease
        # this replica creates starts above it, so that terms never go backwards along
        # the data's history (a set seeded from a restore or a replica cluster).
        self.term_floor = 0

    # -------------------------------------------------------------- loading

    def load(self, engine: Engine) -> Position:
        """Read the position, the term history and the set left after recovery; the
        engine's lsn continues from the stored lsn (a clean shutdown leaves an empty
        WAL)."""
        assert engine.meta is not None
        with engine.meta.env.begin() as txn:
            raw = txn.get(KEY_POSITION, db=engine.meta.dbs[DB_INFO])
            terms = txn.get(KEY_TERMS, db=engine.meta.dbs[DB_INFO])
            left = txn.get(KEY_LEFT, db=engine.meta.dbs[DB_INFO])
            followed = txn.get(KEY_FOLLOWED, db=engine.meta.dbs[DB_INFO])
            promoted = txn.get(KEY_SINGLE_NODE_TERM, db=engine.meta.dbs[DB_INFO])
        self.left = None if left is None else str(json.loads(bytes(left))["set"])
        self.term_floor = max(
            _term_in(left, "position"),
            _term_in(followed, "source_term"),
            _term_in(promoted, "term"),
        )
        if raw is not None:
            term, lsn = POSITION.unpack(bytes(raw))
            self.durable = (term, max(lsn, engine.lsn))
            engine.lsn = self.durable[1]
        if terms is not None:
            self.terms = [(int(t), int(s)) for t, s in json.loads(bytes(terms))]
        self.term_floor = max(self.term_floor, self.durable[0], *(t for t, _ in self.terms))
        return self.durable

    def replayed(self, lsn: int, changes: list[walmod.Entry], frame: memoryview) -> None:
        """A frame recovery replayed: kept with its term, so that after a crash the
        primary can still ship the frames its WAL held (what a standby a few frames
        behind needs) rather than have that standby re-copy everything. A frame
        without a position (written before this data joined a replica set) ends
        what can be shipped: the kept frames must follow one another."""
        for entry in changes:
            if entry[0] == walmod.PUT and entry[1] == DB_INFO and entry[2] == KEY_POSITION:
                term = POSITION.unpack(bytes(entry[3]))[0]
                self.recovered.append((term, lsn, bytes(frame)))
                return
        self.recovered.clear()

    # ------------------------------------------------------- the commit path

    def check_writable(self) -> None:
        if not self.writable:
            raise StorageError("this replica is a standby: writes go to the primary")

    def stamp(self, batch: Batch, lsn: int) -> None:
        """Add the position (and a new term's start) to the batch's metadata."""
        changes = batch.changes
        if not self.terms or self.terms[-1][0] != self.term:
            self.terms.append((self.term, lsn))
            terms = json.dumps(self.terms).encode()
            changes.append((walmod.PUT, DB_INFO, KEY_TERMS, terms))
        changes.append((walmod.PUT, DB_INFO, KEY_POSITION, POSITION.pack(self.term, lsn)))

    def committed(self, lsn: int, frame: bytes) -> None:
        self.durable = (self.term, lsn)
        if self.on_frame is not None:
            self.on_frame(self.term, lsn, frame)

    def follow(self, lsn: int, changes: list[walmod.Entry]) -> Position:
        """The position a frame from the primary carries (its stamp; ours at ``lsn``
        when it has none), taking up the term history it brings."""
        position: Position = (self.term, lsn)
        for e in changes:
            if e[0] != walmod.PUT or e[1] != DB_INFO:
                continue
            if e[2] == KEY_TERMS:
                self.terms = [(int(t), int(s)) for t, s in json.loads(bytes(e[3]))]
            elif e[2] == KEY_POSITION:
                position = POSITION.unpack(e[3])
        return position

    # ------------------------------------------------------ history queries

    def term_end(self, term: int, last_lsn: int) -> int | None:
        """The last lsn written under ``term`` in our history (None: never our term).
        A follower at (term, lsn) with lsn past it holds frames we never had."""
        for i, (t, _) in enumerate(self.terms):
            if t == term:
                return self.terms[i + 1][1] - 1 if i + 1 < len(self.terms) else last_lsn
        return None


def holds_data(engine: Engine) -> bool:
    """Whether this directory holds anything a replica set could lose: a stream was
    ever created (``next_stream_id``), a keyed value written, a replica position
    recorded, or a set left (``leave_set``: what the set had, and maybe more). Read
    after recovery, before the replica follows or leads."""
    assert engine.meta is not None
    dbs = engine.meta.dbs
    with engine.meta.env.begin() as txn:
        for key in (KEY_NEXT_STREAM_ID, KEY_POSITION, KEY_LEFT):
            if txn.get(key, db=dbs[DB_INFO]) is not None:
                return True
        return any(txn.cursor(db=dbs[db]).first() for db in (DB_STREAMS, DB_RECORDS))


def stamp_base(engine: Engine, hooks: ReplicaHooks, term: int) -> Position:
    """Give data written before this directory joined a replica set (single-node data
    whose replica has just created the set's Lease) a position: ``(term, lsn)`` with
    lsn one past the last lsn recovery saw, and the term history starting there.

    No frame anywhere carries an lsn at or below this base (the single-node history is
    in LMDB and the segment files only), and it is at least 1: a follower at (0, 0),
    or anywhere below it, finds no frame to follow on (``Shipper.refusal``: too far
    behind) and re-copies, instead of following the first frame of the new term and
    missing everything before it. One LMDB transaction, flushed (meta page
    included) before this replica writes as primary, so that the frames it ships
    after it never outlive it; it also drops the record of a set this directory
    left (``leave_set``): it is now the new set's. Runs while the engine writes
    nothing else (a standby's pipeline, before ``writable``)."""
    lsn = engine.lsn + 1
    engine.write_metadata(
        [
            (walmod.PUT, DB_INFO, KEY_TERMS, json.dumps([[term, lsn]]).encode()),
            (walmod.PUT, DB_INFO, KEY_POSITION, POSITION.pack(term, lsn)),
            (walmod.DELETE, DB_INFO, KEY_LEFT),
        ],
        flush=True,
    )
    engine.lsn = lsn
    hooks.terms = [(term, lsn)]
    hooks.durable = (term, lsn)
    hooks.left = None
    return hooks.durable


@dataclass(frozen=True, slots=True)
class Left:
    """The replica set a directory left (``leave_set``)."""

    set_id: str  # "" for a set from before set ids
    position: Position | None  # where its history stopped; None: it had none


def leave_set(engine: Engine) -> Left | None:
    """Make a replica set member's directory single-node data, before a single node
    writes anything to it; None when it is no set's (nothing changes).

    A directory is a member while it holds a set id file or a replica position
    (``replication/identity.py``). A single node's writes move no position, so a
    member written to alone would still look like one at its old position, and a
    standby at that position would be counted in sync without those writes. So it
    leaves first, in two steps, either of which a crash may stop before:

    1. one LMDB transaction, flushed: the position and the term history deleted,
       and ``replica_left`` recording the set id and the position it stopped at;
    2. the set id file removed (the directory flushed).

    Stopped before 1, the directory is the member it was, with exactly the set's
    history (nothing was written alone yet), and the next single-node start leaves
    again. Between 1 and 2 it has no position and a set id file naming the set it
    left, which ``ReplicaHooks.left`` tells the classification to ignore: it is
    single-node data (``holds_data`` counts ``replica_left``), and the next
    single-node start removes the file. The key stays until ``stamp_base`` makes
    the directory a new set's. A set id file naming another set than the one left
    (a set this directory began later, before it wrote a position) is left in turn.

    Runs on the recovery thread after ``Engine.open`` and before the store starts
    its pipeline: nothing else writes meanwhile."""
    assert engine.meta is not None
    info = engine.meta.dbs[DB_INFO]
    set_id = engine.layout.read_set_id()
    with engine.meta.env.begin() as txn:
        raw = txn.get(KEY_POSITION, db=info)
        terms = txn.get(KEY_TERMS, db=info)
        left = txn.get(KEY_LEFT, db=info)
    done = None if left is None else json.loads(bytes(left))
    if raw is None and terms is None:
        if not set_id:
            return None  # no set's: empty, single-node data, or a set left before
        if done is not None and done["set"] == set_id:  # a crash stopped step 2
            remove_set_id(engine.layout)
            return Left(set_id, None if done["position"] is None else _pair(done["position"]))
    position = None if raw is None else _pair(POSITION.unpack(bytes(raw)))
    record = {"set": set_id, "position": None if position is None else list(position)}
    engine.write_metadata(  # step 1, durable (the meta page too) before the file goes
        [
            (walmod.DELETE, DB_INFO, KEY_POSITION),
            (walmod.DELETE, DB_INFO, KEY_TERMS),
            (walmod.PUT, DB_INFO, KEY_LEFT, json.dumps(record).encode()),
        ],
        flush=True,
    )
    if set_id:
        remove_set_id(engine.layout)  # step 2
    return Left(set_id, position)


def _pair(pair: Iterable[int]) -> Position:
    term, lsn = pair
    return (int(term), int(lsn))


Applied = tuple[int, Position, list[walmod.Entry]]  # lsn, position, metadata changes


@dataclass(slots=True)
class Written:
    """Frames of one group received durable in the WAL, their metadata not yet in LMDB
    (``write_frames``; ``commit_frames`` finishes them, and keeps in ``prior`` the
    tails each frame replaced: ``engine/prior_tails.py``)."""

    appended: AppendedFrames
    positions: list[Position]
    prior: list[Prior] = field(default_factory=list)


def frame_changes(frame: bytes) -> tuple[int, list[walmod.Entry]]:
    """A frame's lsn and metadata changes (its writes to segment files left out): what
    the stream layer learns from it. ValueError when it is damaged."""
    try:
        lsn, entries = walmod.decode_frame(frame)
    except walmod.WalCorrupt as exc:
        raise ValueError(str(exc)) from None
    return lsn, [e for e in entries if e[0] != walmod.WRITE]


def write_frames(engine: Engine, hooks: ReplicaHooks, frames: list[bytes]) -> Written | None:
    """The durable half of applying frames from the primary (``Engine.append_frames``:
    segment files, the frames appended to the WAL as they came, one fdatasync). From
    here the frames survive a crash (recovery replays the WAL into LMDB), so the
    position they carry is this replica's durable position (``hooks.durable``), and a
    standby may report it to the primary while ``commit_frames`` writes LMDB. None
    when there are no frames.

    Runs on a worker thread, while the pipeline is idle (a standby's own commits are
    refused) and the previous answer's ``commit_frames`` has returned: nothing else
    writes meanwhile. A failure fails the engine closed: the frames are the primary's,
    and a restart is the only safe retry.
    """
    appended = engine.append_frames(frames)
    if appended is None:
        return None
    positions = [hooks.follow(lsn, changes) for lsn, changes in appended.frames]
    hooks.durable = positions[-1]
    return Written(appended, positions)


def commit_frames(engine: Engine, written: Written) -> list[Applied]:
    """The rest of applying frames (``Engine.commit_frames``: one LMDB transaction,
    then the engine's tails, punches and deletions, by the same step as a batch of
    its own). Returns, per frame, its lsn, the position it carries and its metadata
    changes (for the stream layer). A failure fails the engine closed; the frames
    stay durable in the WAL, which a restart replays."""
    frames = written.appended.frames
    written.prior = prior_tails(engine, frames)
    engine.commit_frames(written.appended)
    return [
        (lsn, position, changes)
        for (lsn, changes), position in zip(frames, written.positions, strict=True)
    ]


def _term_in(raw: object, field: str) -> int:
    """The term a JSON value of LMDB names in ``field`` (a number, or a [term, lsn]
    position); 0 when there is no value or no term."""
    if raw is None:
        return 0
    value = json.loads(bytes(raw)).get(field)  # type: ignore[call-overload]
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, int) else 0
