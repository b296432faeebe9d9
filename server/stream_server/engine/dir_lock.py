"""One writer per data directory: an exclusive lock on its ``.lock`` file, held by the
process that writes the directory for as long as it lives.

LMDB lets two processes write one environment (its own lock file serialises their
transactions), and nothing else in a data directory stops a second server: two of
them on one volume would each keep their own tails and WAL and overwrite each
other's segment files while acknowledging every write. So a process that writes a
data directory (``serve``, ``recover``, ``restore``, a replica cluster's bootstrap)
takes this lock before it reads anything, as PostgreSQL's ``postmaster.pid`` guards a
cluster's directory; a second one is refused at once, told who holds it.

The lock is ``flock(2)`` on an open file: the kernel drops it when its holder dies,
however it dies, so a stale lock is never left behind, and the file's text (the
holder's PID, host and start) is only a description, rewritten by each new holder.
On NFS, Linux maps ``flock`` to the server's byte-range locks, so two hosts sharing
a volume exclude each other too. The descriptor is close-on-exec: worker processes
(which only read) do not inherit it, and a process that execs itself again (fencing,
a standby's re-copy) takes it afresh.

Within one process the lock is counted, not taken twice (``flock`` would refuse a
second descriptor of the same process): the server holds it for its life and its
engine, or a restore inside it, take it again and give it back. The lock file is not
data: it is written with plain ``os`` calls, outside ``fsio``'s recorded order.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stream_format.layout import LOCK_FILE


class DataDirInUse(Exception):
    """Another process holds the data directory's lock; the message names it."""


@dataclass(slots=True)
class _Held:
    fd: int
    count: int


_held: dict[tuple[int, int], _Held] = {}
_guard = threading.Lock()


def acquire(root: Path) -> None:
    """Take ``root``'s lock (creating ``root`` if it is missing), or raise
    ``DataDirInUse`` at once, naming the holder. Give it back with ``release``."""
    root.mkdir(exist_ok=True)  # its parent must exist: the settings' check says so first
    key = _key(root)
    with _guard:
        held = _held.get(key)
        if held is not None:
            held.count += 1
            return
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe(_read(fd))
            os.close(fd)
            raise DataDirInUse(
                f"{root} is in use by {holder}: only one process may write a data "
                "directory at a time (stop it first, or use another --data-dir)"
            ) from None
        _write(fd)
        _held[key] = _Held(fd, 1)


def release(root: Path) -> None:
    """Give back one ``acquire`` of ``root``; the last one unlocks it. The file stays:
    removing it would let a process that opened it just before lock an orphan."""
    key = _key(root)
    with _guard:
        held = _held[key]
        held.count -= 1
        if held.count == 0:
            del _held[key]
            os.close(held.fd)  # closing the last descriptor drops the flock


class Held:
    """One ``acquire`` of a directory's lock, given back at most once: an engine's,
    from its open to its close (or its failed open)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.held = False

    def take(self) -> None:
        acquire(self.root)
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            release(self.root)


@contextlib.contextmanager
def holding(root: Path) -> Iterator[None]:
    """``root``'s lock for the length of a ``with`` block."""
    acquire(root)
    try:
        yield
    finally:
        release(root)


def describe(holder: dict[str, object] | None) -> str:
    if not holder:
        return "another process (it has not written its PID yet)"
    return f"process {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')})"


def _key(root: Path) -> tuple[int, int]:
    """The directory itself, however it was named (a symlink, a relative path)."""
    st = os.stat(root)
    return st.st_dev, st.st_ino


def _write(fd: int) -> None:
    text = json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    os.ftruncate(fd, 0)
    os.pwrite(fd, (text + "\n").encode(), 0)


def _read(fd: int) -> dict[str, object] | None:
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"null")
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
