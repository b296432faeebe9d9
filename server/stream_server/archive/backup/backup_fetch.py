"""A base backup fetched for a restore: its parts downloaded a few at a time and in
order, each checked against the manifest's size and CRC-32 before a byte of it is
used, the tar read as one stream across them and extracted file by file, each file
checked against the manifest as it is written. No copy of the tar touches the disk,
and every part is read to its end, even past the tar's last member, so that every
part is checked.

The extraction takes regular files and directories inside the target only (what
Python's ``data`` filter allows, checked here because a streamed tar cannot be
listed first), and only the files the manifest lists, every one of them.
"""

from __future__ import annotations

import tarfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from stream_format.records import crc32
from stream_server.archive import progress
from stream_server.archive.object_store import ObjectStore

PREFETCH = 3  # parts downloading at once (64 MiB each: at most this many in memory)
CHUNK = 1024 * 1024


class BackupDamaged(Exception):
    """A part or a file that does not match its manifest; the message names it."""


def fetch(store: ObjectStore, manifest: dict[str, Any], root: Path) -> int:
    """Extract the backup into ``root`` (created), every part and file checked; the
    bytes downloaded."""
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(PREFETCH, thread_name_prefix="backup-part") as pool:
        reader = PartsReader(store, list(manifest["parts"]), pool)
        try:
            _extract(reader, manifest, root)
            while reader.read(CHUNK):  # the tar's padding: the last parts are checked too
                pass
        finally:
            reader.cancel()
    return reader.total


class PartsReader:
    """The parts as one file-like stream; a damaged part raises where it is reached."""

    def __init__(self, store: ObjectStore, parts: list[dict[str, Any]], pool: ThreadPoolExecutor):
        self.store = store
        self.parts = parts
        self.pool = pool
        self.total = 0
        self._next = 0
        self._pending: deque[Future[bytes]] = deque()
        self._buf = memoryview(b"")
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) < PREFETCH and self._next < len(self.parts):
            self._pending.append(self.pool.submit(self._get, self.parts[self._next]))
            self._next += 1

    def _get(self, part: dict[str, Any]) -> bytes:
        name = str(part["name"])
        data = self.store.get(name)
        if len(data) != int(part["size"]):
            raise BackupDamaged(
                f"backup part {name}: {len(data)} bytes, the manifest says {part['size']} "
                "(truncated or replaced)"
            )
        if crc32(data) != int(part["crc32"]):
            raise BackupDamaged(f"backup part {name}: checksum mismatch (altered)")
        return data

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            if not self._buf:
                if not self._pending:
                    break
                data = self._pending.popleft().result()
                self.total += len(data)
                progress.note(len(data))  # here, in the caller's thread: its meter
                self._buf = memoryview(data)
                self._fill()
                continue
            take = len(self._buf) if n < 0 else min(n - len(out), len(self._buf))
            out += self._buf[:take]
            self._buf = self._buf[take:]
        return bytes(out)

    def cancel(self) -> None:
        for future in self._pending:
            future.cancel()


def _extract(reader: PartsReader, manifest: dict[str, Any], root: Path) -> None:
    backup = manifest["id"]
    files = {str(f["path"]): f for f in manifest["files"]}
    seen: set[str] = set()
    inside = root.resolve()
    with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            target = root / member.name
            if not (member.isfile() or member.isdir()) or not (
                target.resolve().is_relative_to(inside)
            ):
                raise BackupDamaged(f"backup {backup} holds {member.name!r}: not a file inside it")
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            want = files.get(member.name)
            if want is None or member.name in seen:
                raise BackupDamaged(f"backup {backup} holds {member.name}, not in its manifest")
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            size, crc = _copy(src, target)
            if (size, crc) != (int(want["size"]), int(want["crc32"])):
                raise BackupDamaged(
                    f"backup {backup}: file {member.name} is {size} bytes with CRC-32 "
                    f"{crc:08x}, the manifest says {want['size']} bytes with "
                    f"{int(want['crc32']):08x}"
                )
            seen.add(member.name)
    missing = sorted(set(files) - seen)
    if missing:
        raise BackupDamaged(
            f"backup {backup} lacks {len(missing)} files of its manifest: {missing[:3]}"
        )


def _copy(src: IO[bytes], target: Path) -> tuple[int, int]:
    size, crc = 0, 0
    with target.open("wb") as out:
        while chunk := src.read(CHUNK):
            out.write(chunk)
            size += len(chunk)
            crc = crc32(chunk, crc)
    return size, crc
