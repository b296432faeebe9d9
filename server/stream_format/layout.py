"""The data directory: where each part lives, and the version file that names the format.

A program refuses a directory whose format it does not understand rather
than guessing (docs/storage-format.md). Writing the layout (creating it,
writing the version file durably) is the engine's job; this module only
names and checks.

The version file carries two numbers, as SQLite's header does: the *write
version* (what a program must understand to change the directory: the WAL,
recovery, every file) and the *read version* (what a program that only reads
committed data, such as the Spark data source, must understand: LMDB and the
segment files). A change that only writers see (the WAL file header of
format 2, the records database and its WAL entries of format 3) raises the
write version alone, so an older reader still reads a
newer directory; a change a reader would misread raises both (format 4's
retained start: below it a segment file holds punched holes, which a reader
that starts at the file's first record would take for damage). Format 5 keeps
small streams' logs in LMDB instead of a file each (the ``inline`` database),
which a reader that knows only files would take for missing files: read version 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WRITE_VERSION = 5  # the newest format this program writes (and recovers)
READ_VERSION = 3  # the newest read version this program reads (3: inline logs)
VERSION_FILE = "FORMAT"
# A replica set member's set id (docs/replication.md, "A set's identity"): 32 lowercase
# hex digits and a newline. Optional: single-node data and a new directory have none.
SET_ID_FILE = "SET_ID"
LMDB_DATA = "data.mdb"
# The writer's lock (stream_server/engine/dir_lock.py): held while a process writes the
# directory; its text names the holder. Not data: readers ignore it, as every name
# starting with a dot.
LOCK_FILE = ".lock"

_FIRST_LINE = "durable-streams-py data format "
_READ_KEY = "read-version"


class FormatError(Exception):
    """The directory is not one this program understands, or it is damaged."""


@dataclass(frozen=True, slots=True)
class DataFormat:
    """A directory's format: its write version and its read version (read <= write)."""

    write: int
    read: int

    @classmethod
    def parse(cls, text: str) -> DataFormat:
        """The versions a version file names; ValueError if it is not one.

        Format 1's file is a single line and means read = write = 1; a file
        without a ``read-version`` line means read = write. Lines with other
        keys are ignored: a change a reader must know about raises the read
        version instead.
        """
        if not text.endswith("\n") or not text.startswith(_FIRST_LINE):
            raise ValueError("not a version file")
        first, *rest = text[:-1].split("\n")
        write = _version(first[len(_FIRST_LINE) :])
        read = write
        for line in rest:
            key, sep, value = line.partition(" ")
            if not sep or not key:
                raise ValueError(f"malformed line {line!r}")
            if key == _READ_KEY:
                read = _version(value)
        if read > write:
            raise ValueError(f"read version {read} is above write version {write}")
        return cls(write, read)

    def text(self) -> str:
        """The version file's content; format 1's single line when read = write = 1."""
        if self.read == self.write:
            return f"{_FIRST_LINE}{self.write}\n"
        return f"{_FIRST_LINE}{self.write}\n{_READ_KEY} {self.read}\n"


def _version(s: str) -> int:
    if not s.isascii() or not s.isdigit() or s.startswith("0"):
        raise ValueError(f"bad version number {s!r}")
    return int(s)


CURRENT = DataFormat(WRITE_VERSION, READ_VERSION)  # what this program writes


def valid_set_id(text: str) -> bool:
    """A set id as servers mint them (``uuid4().hex``): 32 lowercase hex digits."""
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


class Layout:
    """The paths of a data directory's parts."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = self.root / "meta"
        self.wal = self.root / "wal"
        self.segments = self.root / "segments"
        self.version_file = self.root / VERSION_FILE
        self.set_id_file = self.root / SET_ID_FILE

    def segment_path(self, stream_id: int) -> Path:
        return self.segments / f"{stream_id & 0xFF:02x}" / f"{stream_id:016x}.log"

    def segment_relpath(self, stream_id: int) -> str:
        return str(self.segment_path(stream_id).relative_to(self.root))

    def read_version(self) -> str | None:
        """The version file's text, or None when there is none."""
        try:
            return self.version_file.read_text(errors="replace")
        except FileNotFoundError:
            return None

    def read_set_id(self) -> str:
        """The replica set this directory belongs to ("" when the file is missing);
        FormatError when the file holds anything but a set id."""
        try:
            text = self.set_id_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        set_id = text.removesuffix("\n")
        if not valid_set_id(set_id) or not text.endswith("\n"):
            raise FormatError(f"{self.set_id_file}: {text[:80]!r} is not a replica set id")
        return set_id

    def check_version(self, *, write: bool = False) -> DataFormat:
        """The directory's format, or FormatError unless this program may use it.

        A reader (the default) needs to know the directory's read version; a
        writer (``write=True``: the server, recovery) needs to know its write
        version. Versions are cumulative: knowing N means knowing 1 .. N.
        """
        text = self.read_version()
        if text is None:
            raise FormatError(
                f"{self.root}: no {VERSION_FILE} file: not a durable-streams data directory"
            )
        try:
            found = DataFormat.parse(text)
        except ValueError as exc:
            raise FormatError(
                f"{self.root}: {VERSION_FILE} {text.strip()!r} is not supported ({exc})"
            ) from None
        if write and found.write > WRITE_VERSION:
            raise FormatError(
                f"{self.root}: data format {found.write} is not supported for writing "
                f"(this program writes formats up to {WRITE_VERSION}); "
                "run a newer server on this directory"
            )
        if found.read > READ_VERSION:
            raise FormatError(
                f"{self.root}: data format {found.write} (read version {found.read}) is not "
                f"supported (this program reads read versions up to {READ_VERSION})"
            )
        return found
