"""A crash-state explorer for the storage engine, in the spirit of ALICE (OSDI 2014)
and CrashMonkey (OSDI 2018).

``kill -9`` keeps the page cache, so it can never show a missing or misordered
flush. Here a workload runs with a recorder attached to the engine's I/O
module (``stream_server.engine.fsio``): every create, write, truncate, rename,
unlink, fsync of a file or a directory, and every LMDB commit and sync is
logged in order, with the workload's acknowledgements between them. Then, for
a crash after any prefix of that log, the explorer builds the directories a
POSIX file system may hold after a power cut:

- a file's content is what its last fsync made durable, plus any prefix of the
  writes and truncations since (possibly the last one torn at a 4 KiB
  boundary), or a random subset of them (the page cache writes back in any
  order);
- a name created, renamed, linked or removed in a directory that was not fsynced since
  may or may not be there;
- LMDB, which does its own I/O, is modelled by its documented guarantee for the
  flags the engine uses (``sync=True, metasync=False``): after a crash the
  environment holds the last committed transaction, or the one before it when
  no ``env.sync()`` came after that last commit.

Each state is written out to a fresh directory for the caller to recover and
check. States that come out byte-identical are checked once. ``KeyedValueHistory``
says which values of keyed state (keyed values, tails) a crash at a given place
may leave: those after some prefix of the submitted operations that holds
every acknowledged one.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from stream_server.engine import fsio
from stream_server.streams.errors import StreamError

T = TypeVar("T")

BLOCK = 4096
LMDB_DATA = "data.mdb"


@dataclass
class Recording:
    """The engine's disk-changing calls in order, with LMDB snapshots and acknowledgements.

    Attach with ``fsio.attach(recording)``; the workload calls ``ack(label)``
    after each operation the engine acknowledged. Paths are stored relative
    to ``root``.
    """

    root: Path
    ops: list[tuple] = field(default_factory=list)
    lmdb: dict[int, bytes] = field(default_factory=dict)  # op index -> data.mdb after it
    origin: int = 0  # ops before this one describe the starting state: no crash among them
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _rel(self, path: str) -> str:
        rel = str(PurePosixPath(Path(path).relative_to(self.root)))
        return "" if rel == "." else rel

    def record(self, op: tuple) -> None:
        kind = op[0]
        if kind in ("rename", "link"):
            op = (kind, self._rel(op[1]), self._rel(op[2]))
        else:
            op = (kind, self._rel(op[1]), *op[2:])
        with self._lock:
            if kind == "lmdb_commit":
                self.lmdb[len(self.ops)] = (self.root / op[1] / LMDB_DATA).read_bytes()
            self.ops.append(op)

    def start_from_disk(self) -> None:
        """Take what ``root`` holds now as durable: the state a recorded run starts from
        (a directory left by an earlier crash, say). Call before attaching."""
        for path in sorted(self.root.rglob("*")):
            if path.is_dir():
                self.record(("mkdir", str(path)))
            elif path.name == LMDB_DATA:
                self.record(("lmdb_commit", str(path.parent)))
                self.record(("lmdb_sync", str(path.parent)))
            elif path.name != "lock.mdb":
                self.record(("create", str(path)))
                self.record(("write", str(path), 0, path.read_bytes()))
                self.record(("fsync", str(path)))
        for path in [self.root, *sorted(p for p in self.root.rglob("*") if p.is_dir())]:
            self.record(("fsync_dir", str(path)))
        self.origin = len(self.ops)

    def ack(self, label: object) -> int:
        """Note that the operation ``label`` was acknowledged; returns its place in the log."""
        with self._lock:
            self.ops.append(("ack", label))
            return len(self.ops) - 1


# ----------------------------------------------------------- the file system


@dataclass
class _Inode:
    durable: bytes = b""  # content as of its last fsync
    cache: bytearray = field(default_factory=bytearray)  # content in the page cache
    pending: list[tuple] = field(default_factory=list)  # ("write", pos, data) | ("truncate", n)


class _Dir:
    def __init__(self) -> None:
        self.entries: dict[str, _Inode | _Dir] = {}
        self.durable: dict[str, _Inode | _Dir] = {}


def _apply(buf: bytearray, op: tuple) -> None:
    if op[0] == "write":
        _, pos, data = op
        if len(buf) < pos:
            buf.extend(bytes(pos - len(buf)))
        buf[pos : pos + len(data)] = data
    else:
        del buf[op[1] :]


def _torn(op: tuple, rng: random.Random) -> tuple | None:
    """The part of a write that reached the disk when it was torn at a block boundary."""
    if op[0] != "write":
        return None
    _, pos, data = op
    cuts = [b - pos for b in range((pos // BLOCK + 1) * BLOCK, pos + len(data), BLOCK)]
    if not cuts:
        return None
    return ("write", pos, data[: rng.choice(cuts)])


class _Tree:
    """The file system after a prefix of the recorded ops: cache and durable views."""

    def __init__(self) -> None:
        self.root = _Dir()

    def _parent(self, rel: str) -> tuple[_Dir, str]:
        parts = PurePosixPath(rel).parts
        node = self.root
        for part in parts[:-1]:
            child = node.entries[part]
            assert isinstance(child, _Dir), rel
            node = child
        return node, parts[-1]

    def _node(self, rel: str) -> _Inode | _Dir:
        if rel in ("", "."):
            return self.root
        parent, name = self._parent(rel)
        return parent.entries[name]

    def do(self, op: tuple) -> None:
        kind, rel = op[0], op[1]
        if kind == "mkdir" and not rel:
            return  # the data directory itself: it exists before the workload starts
        if kind == "mkdir":
            parent, name = self._parent(rel)
            parent.entries[name] = _Dir()
        elif kind == "create":
            parent, name = self._parent(rel)
            parent.entries[name] = _Inode()
        elif kind in ("write", "truncate"):
            inode = self._node(rel)
            assert isinstance(inode, _Inode), op
            change = ("write", op[2], op[3]) if kind == "write" else ("truncate", op[2])
            _apply(inode.cache, change)
            inode.pending.append(change)
        elif kind == "fsync":
            inode = self._node(rel)
            assert isinstance(inode, _Inode), op
            inode.durable = bytes(inode.cache)
            inode.pending.clear()
        elif kind == "fsync_dir":
            node = self._node(rel)
            assert isinstance(node, _Dir), op
            node.durable = dict(node.entries)
        elif kind == "unlink":
            parent, name = self._parent(rel)
            parent.entries.pop(name, None)
        elif kind == "rename":
            src_parent, src_name = self._parent(rel)
            dst_parent, dst_name = self._parent(op[2])
            dst_parent.entries[dst_name] = src_parent.entries.pop(src_name)
        elif kind == "link":  # a second name for the same inode
            src_parent, src_name = self._parent(rel)
            dst_parent, dst_name = self._parent(op[2])
            dst_parent.entries[dst_name] = src_parent.entries[src_name]


@dataclass(frozen=True)
class Choice:
    """How one crash state is cut from the log.

    ``names``: "cache" (every unsynced directory change survived), "durable"
    (none did) or "mixed" (each directory at random). ``data``: "cache",
    "durable", or "mixed" (each file keeps a random prefix of its unsynced
    changes, the next one possibly torn, or a random subset). ``lmdb``:
    "latest" or "earliest" of the transactions that may have survived.
    """

    names: str
    data: str
    lmdb: str
    seed: int = 0


CACHE = Choice("cache", "cache", "latest")  # what kill -9 leaves
DURABLE = Choice("durable", "durable", "earliest")  # only what was flushed


@dataclass(frozen=True)
class CrashState:
    point: int  # the number of recorded ops that happened before the crash
    choice: Choice
    digest: str  # of the files written out: equal digests, equal states


def build(rec: Recording, point: int, choice: Choice, out: Path) -> CrashState:
    """Write the state a crash after ``rec.ops[:point]`` may leave into ``out``."""
    tree = _Tree()
    for op in rec.ops[:point]:
        if op[0] not in ("ack", "lmdb_commit", "lmdb_sync"):
            tree.do(op)
    rng = random.Random(f"{point}/{choice}")
    digest = hashlib.sha256()
    out.mkdir(parents=True, exist_ok=True)
    _write_dir(tree.root, out, choice, rng, digest, "")
    lmdb_dir, snapshot = _lmdb_state(rec, point, choice)
    if lmdb_dir is not None and snapshot is not None and (out / lmdb_dir).is_dir():
        (out / lmdb_dir / LMDB_DATA).write_bytes(snapshot)
        digest.update(f"lmdb:{lmdb_dir}:".encode() + hashlib.sha256(snapshot).digest())
    return CrashState(point, choice, digest.hexdigest())


def _write_dir(node: _Dir, out: Path, choice: Choice, rng: random.Random, digest, rel: str) -> None:
    names = choice.names
    if names == "mixed":
        names = rng.choice(("cache", "durable"))
    entries = node.entries if names == "cache" else node.durable
    for name in sorted(entries):
        child = entries[name]
        path = out / name
        sub = f"{rel}/{name}"
        if isinstance(child, _Dir):
            path.mkdir(exist_ok=True)
            digest.update(f"d:{sub}\n".encode())
            _write_dir(child, path, choice, rng, digest, sub)
        else:
            data = _content(child, choice.data, rng)
            path.write_bytes(data)
            digest.update(f"f:{sub}:".encode() + hashlib.sha256(data).digest())


def _content(inode: _Inode, how: str, rng: random.Random) -> bytes:
    if how == "cache" or not inode.pending:
        return bytes(inode.cache) if how == "cache" else inode.durable
    buf = bytearray(inode.durable)
    if how == "durable":
        return bytes(buf)
    if rng.random() < 0.25:  # written back in any order: a random subset
        for change in inode.pending:
            if rng.random() < 0.5:
                _apply(buf, change)
        return bytes(buf)
    keep = rng.randrange(len(inode.pending) + 1)
    for change in inode.pending[:keep]:
        _apply(buf, change)
    if keep < len(inode.pending):
        torn = _torn(inode.pending[keep], rng)
        if torn is not None and rng.random() < 0.5:
            _apply(buf, torn)
    return bytes(buf)


def _lmdb_state(rec: Recording, point: int, choice: Choice) -> tuple[str | None, bytes | None]:
    """The LMDB environment directory and the data file a crash at ``point`` may leave."""
    commits = [i for i in rec.lmdb if i < point]
    if not commits:
        return None, None
    last = commits[-1]
    env_dir = rec.ops[last][1]
    synced = any(op[0] == "lmdb_sync" for op in rec.ops[last + 1 : point])
    if choice.lmdb == "earliest" and not synced and len(commits) > 1:
        return env_dir, rec.lmdb[commits[-2]]
    return env_dir, rec.lmdb[last]


# ------------------------------------------------------------------ exploring


def crash_points(rec: Recording) -> list[int]:
    """Every place between two recorded ops (and after the last)."""
    return list(range(max(rec.origin, 1), len(rec.ops) + 1))


def choices_for(point: int, mixed: int) -> list[Choice]:
    return [CACHE, DURABLE] + [
        Choice("mixed", "mixed", ("latest", "earliest")[s % 2], seed=s) for s in range(mixed)
    ]


def plan(rec: Recording, budget: int, *, mixed: int = 3, seed: int = 0) -> list[tuple[int, Choice]]:
    """At most ``budget`` (point, choice) pairs: every point's pessimistic state first,
    then a seeded sample of the rest."""
    points = crash_points(rec)
    first = [(p, DURABLE) for p in points]
    rest = [(p, c) for p in points for c in choices_for(p, mixed) if c is not DURABLE]
    rng = random.Random(seed)
    rng.shuffle(first)
    rng.shuffle(rest)
    return (first + rest)[:budget]


def explore(
    rec: Recording, budget: int, workdir: Path, *, mixed: int = 3, seed: int = 0
) -> Iterator[tuple[CrashState, Path | None]]:
    """Build each planned state; yields it with its directory, or None when an equal
    state was already yielded (check it once)."""
    seen: set[str] = set()
    for n, (point, choice) in enumerate(plan(rec, budget, mixed=mixed, seed=seed)):
        out = workdir / f"state-{n:05d}"
        state = build(rec, point, choice, out)
        if state.digest in seen:
            yield state, None
            continue
        seen.add(state.digest)
        yield state, out


def recorded(rec: Recording, workload: Callable[[Recording], Coroutine[Any, Any, T]]) -> T:
    """Run ``workload`` with the engine's I/O recorded into ``rec``; the recorder is
    detached whatever happens, so a failed workload cannot leak it into the next test."""
    fsio.attach(rec)
    try:
        return asyncio.run(workload(rec))
    finally:
        fsio.attach(None)


def check_each(
    rec: Recording,
    budget: int,
    workdir: Path,
    check: Callable[[CrashState, Path], None],
    *,
    mixed: int = 3,
) -> tuple[int, int]:
    """Run ``check`` on every distinct explored state (deleting its directory after);
    return how many states were explored and how many were distinct.

    A failure (or a recovery that raises) is reported with the crash point and the
    choice that built the state: without them a failing state cannot be found again."""
    explored = distinct = 0
    for state, directory in explore(rec, budget, workdir, mixed=mixed):
        explored += 1
        if directory is None:
            continue
        distinct += 1
        try:
            check(state, directory)
        except (AssertionError, StreamError, OSError) as exc:
            raise AssertionError(
                f"crash after op {state.point} of {len(rec.ops)} "
                f"({rec.ops[state.point - 1][:3]}), {state.choice}: {exc}"
            ) from exc
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return explored, distinct


# ---------------------------------------------------------- keyed state checks


@dataclass
class KeyedValueHistory:
    """Puts and deletes of keyed values, in the order they were submitted, and where
    in a recording each was acknowledged: what a crash state may hold.

    Batches are made durable in submission order and each one whole, so a
    recovered directory must hold the values after *some prefix* of the
    submitted operations, one that contains every operation acknowledged
    before the crash. A later acknowledged change lost, an earlier value come
    back, or part of a batch without the rest all fail ``check``. Submit an
    operation right before handing it to the store (in the same step, with no
    ``await`` between) so that the order here is the store's.
    """

    ops: list[tuple[object, bytes | None]] = field(default_factory=list)  # key, value or None
    acked: list[int | None] = field(default_factory=list)  # place of its ack in the recording

    def submit(self, key: object, value: bytes | None) -> int:
        self.ops.append((key, value))
        self.acked.append(None)
        return len(self.ops) - 1

    def ack(self, rec: Recording, index: int) -> None:
        self.acked[index] = rec.ack(("keyed", self.ops[index][0]))

    def states(self, point: int) -> Iterator[tuple[int, dict[object, bytes]]]:
        """Each allowed state after a crash at ``point``: (operations applied, values)."""
        need = max(
            (i + 1 for i, at in enumerate(self.acked) if at is not None and at < point), default=0
        )
        values: dict[object, bytes] = {}
        for i, (key, value) in enumerate(self.ops):
            if i >= need:
                yield i, dict(values)
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        yield len(self.ops), values

    def check(self, point: int, got: dict[object, bytes]) -> int:
        """The number of operations ``got`` reflects; AssertionError if it is no allowed state."""
        first: dict[object, bytes] | None = None
        for applied, values in self.states(point):
            if values == got:
                return applied
            if first is None:
                first = values
        assert first is not None  # states() yields at least the state after every operation

        def short(v: bytes | None) -> str:
            return "absent" if v is None else repr(v if len(v) <= 40 else v[:37] + b"...")

        diff = {
            k: f"{short(got.get(k))} (acknowledged: {short(first.get(k))})"
            for k in sorted({*got, *first}, key=repr)
            if got.get(k) != first.get(k)
        }
        acked = sum(1 for at in self.acked if at is not None and at < point)
        raise AssertionError(
            f"keyed state after a crash at op {point} is no prefix of the submitted "
            f"operations that holds the {acked} acknowledged ones; it differs in {diff}"
        )
