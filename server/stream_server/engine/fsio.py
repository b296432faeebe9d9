"""Every file-system call the engine makes, in one place.

Durability rests on the order of writes, flushes, creations, renames and
deletions; here that order is visible in one small module, and a recorder can
be attached to see every call that changes the disk. The crash-state explorer
(``testkit.crashstates``) records a workload this way and rebuilds the states
a crash could leave on a POSIX file system: unsynced writes dropped, kept or
torn, creations and renames whose directory was not synced lost. LMDB does
its own I/O, so the engine reports its commits and syncs here too.

With no recorder attached (always, outside that explorer), each function is
the plain ``os`` call plus one test of a global. With one attached, each call
and its note are made under one lock, so the log's order is the order the
disk saw even when several threads (the commit thread, a checkpoint's flush
threads) work at once: a flush noted after another thread's unlink of the
same file, though it ran before it, is a history no disk had.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

# Threads that flush segment files in a clean stop's checkpoint and at the end of
# recovery. The file system commits concurrent flushes together (ext4 takes every
# fdatasync waiting into one journal commit), and a stop must end within the pod's
# grace period: one flush after another, a server that had written to 100,000
# streams took 19 to 32 s to stop (docs/kubernetes.md, "Sizing"). The background
# checkpoint keeps to one thread, so as not to hold up the commits beside it.
FLUSH_WORKERS = 16

Op = tuple[Any, ...]  # ("write", path, pos, data), ("fsync", path), ...


class Recorder(Protocol):
    """Told of each call that changes the disk, after it succeeded.

    Ops: ``("create", path)``, ``("write", path, pos, data)``, ``("truncate", path,
    size)``, ``("fsync", path)``, ``("fsync_dir", path)``, ``("unlink", path)``,
    ``("rename", src, dst)``, ``("mkdir", path)``, ``("lmdb_commit", env_dir)``,
    ``("lmdb_sync", env_dir)``.
    """

    def record(self, op: Op) -> None: ...


_recorder: Recorder | None = None
_paths: dict[int, str] = {}  # fd -> path, kept only while a recorder is attached


def attach(recorder: Recorder | None) -> None:
    """Attach (or, with None, detach) the recorder. Test use only."""
    global _recorder
    _recorder = recorder
    _paths.clear()


_order = threading.RLock()  # held across a call and its note while a recorder is attached
_unordered = contextlib.nullcontext()


def _note(op: Op) -> None:
    if _recorder is not None:
        _recorder.record(op)


def _in_order() -> contextlib.AbstractContextManager[Any]:
    return _order if _recorder is not None else _unordered


# ------------------------------------------------------------------- files


def open_write(path: Path, *, append: bool = False) -> int:
    """A write descriptor, creating the file if needed."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
    if _recorder is None:
        return os.open(path, flags, 0o644)
    with _order:
        existed = os.path.exists(path)
        fd = os.open(path, flags, 0o644)
        _paths[fd] = str(path)
        if not existed:
            _note(("create", str(path)))
    return fd


def open_read(path: Path) -> int:
    return os.open(path, os.O_RDONLY)


def close(fd: int) -> None:
    _paths.pop(fd, None)
    os.close(fd)


def _pwrite_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    n = os.pwrite(fd, data, pos)
    if n == len(data):  # the common case: one call, no view made
        return
    view = memoryview(data)[n:]
    pos += n
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n


def pwrite(fd: int, data: bytes | memoryview, pos: int) -> None:
    """Write all of ``data`` at ``pos``."""
    if _recorder is None:
        _pwrite_all(fd, data, pos)
        return
    with _order:
        _pwrite_all(fd, data, pos)
        _note(("write", _paths[fd], pos, bytes(data)))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def append(fd: int, data: bytes) -> None:
    """Write all of ``data`` at the end of a file opened with ``append=True``."""
    if _recorder is None:
        _write_all(fd, data)
        return
    with _order:
        start = os.fstat(fd).st_size
        _write_all(fd, data)
        _note(("write", _paths[fd], start, bytes(data)))


def pread(fd: int, size: int, pos: int) -> bytes:
    return os.pread(fd, size, pos)


def size(fd: int) -> int:
    return os.fstat(fd).st_size


def fdatasync(fd: int) -> None:
    if _recorder is None:
        os.fdatasync(fd)
        return
    with _order:
        os.fdatasync(fd)
        _note(("fsync", _paths[fd]))


def fdatasync_path(path: Path) -> bool:
    """Flush a file by name; False if it no longer exists."""
    with _in_order():
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        _note(("fsync", str(path)))
    return True


def fdatasync_paths(paths: list[Path], workers: int) -> None:
    """``fdatasync_path`` for each, on ``workers`` threads (``FLUSH_WORKERS`` says
    why); the first error is raised once all have ended."""

    def flush(part: list[Path]) -> None:
        for path in part:
            fdatasync_path(path)

    if workers <= 1 or len(paths) <= workers:
        flush(paths)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="flush") as pool:
        for _ in pool.map(flush, [paths[i::workers] for i in range(workers)]):
            pass


def ftruncate(fd: int, length: int) -> None:
    with _in_order():
        os.ftruncate(fd, length)
        if _recorder is not None:
            _note(("truncate", _paths[fd], length))


# fallocate(2) modes (linux/falloc.h). Python wraps posix_fallocate, which only
# allocates; giving blocks back takes the Linux call itself, through libc.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
_fallocate: Any = None


def punch_hole(fd: int, pos: int, length: int) -> None:
    """Give the file system back the blocks of ``[pos, pos + length)``, keeping the
    file's size; they read as zeros from then on. OSError (EOPNOTSUPP) where the
    file system cannot. Recorded as a write of zeros: what a crash can leave of
    it is what it can leave of such a write (done, not done, partly done)."""
    global _fallocate
    if length <= 0:
        return
    if _fallocate is None:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.fallocate
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int
        _fallocate = fn
    with _in_order():
        if _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, pos, length) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        if _recorder is not None:
            _note(("write", _paths[fd], pos, bytes(length)))


def truncate(path: Path, length: int) -> None:
    with _in_order():
        os.truncate(path, length)
        _note(("truncate", str(path), length))


def write_durably(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data`` atomically and durably: temporary file, flush, rename."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_write(tmp)
    try:
        os.ftruncate(fd, 0)
        pwrite(fd, data, 0)
        fdatasync(fd)
    finally:
        close(fd)
    rename(tmp, path)
    fsync_dir(path.parent)


# ------------------------------------------------------------- directories


def mkdir(path: Path) -> None:
    """Create a directory (and its parents) if missing."""
    if path.is_dir():
        return
    if not path.parent.is_dir():
        mkdir(path.parent)
    with _in_order():
        try:
            os.mkdir(path)
        except FileExistsError:
            if path.is_dir():
                return  # another thread made it first
            raise
        _note(("mkdir", str(path)))


def unlink(path: Path) -> None:
    """Remove a file if it exists."""
    with _in_order():
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        _note(("unlink", str(path)))


def rename(src: Path, dst: Path) -> None:
    with _in_order():
        os.rename(src, dst)
        _note(("rename", str(src), str(dst)))


def link(src: Path, dst: Path) -> None:
    """A second name for a file (FileExistsError when ``dst`` exists)."""
    with _in_order():
        os.link(src, dst)
        _note(("link", str(src), str(dst)))


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (creations, renames, removals) durable."""
    with _in_order():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _note(("fsync_dir", str(path)))


# -------------------------------------------------------------------- LMDB


def lmdb_committed(env_dir: Path) -> None:
    """An LMDB write transaction committed (data pages flushed; meta page not, with
    ``metasync=False``)."""
    _note(("lmdb_commit", str(env_dir)))


def lmdb_synced(env_dir: Path) -> None:
    """``env.sync(True)`` returned: every committed transaction is durable."""
    _note(("lmdb_sync", str(env_dir)))
