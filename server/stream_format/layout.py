"""The data directory: where each part lives, and the version file that names the format.

A program refuses a directory whose format it does not understand rather
than guessing (docs/storage-format.md). Writing the layout (creating it,
writing the version file durably) is the engine's job; this module only
names and checks.
"""

from __future__ import annotations

from pathlib import Path

FORMAT_VERSION = 1
VERSION_FILE = "FORMAT"
VERSION_LINE = f"durable-streams-py data format {FORMAT_VERSION}\n"
LMDB_DATA = "data.mdb"


class FormatError(Exception):
    """The directory is not one this program understands, or it is damaged."""


class Layout:
    """The paths of a data directory's parts."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = self.root / "meta"
        self.wal = self.root / "wal"
        self.segments = self.root / "segments"
        self.version_file = self.root / VERSION_FILE

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

    def check_version(self) -> None:
        """FormatError unless the version file names the format this program reads."""
        text = self.read_version()
        if text is None:
            raise FormatError(
                f"{self.root}: no {VERSION_FILE} file: not a durable-streams data directory"
            )
        if text != VERSION_LINE:
            raise FormatError(
                f"{self.root}: data format {text.strip()!r} is not supported "
                f"(this program reads {VERSION_LINE.strip()!r})"
            )
