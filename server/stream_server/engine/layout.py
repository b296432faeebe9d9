"""The data directory's layout and its version file.

A server refuses a layout it does not understand rather than guessing: the
version file names the on-disk format (docs/storage-format.md).
"""

from __future__ import annotations

import os
from pathlib import Path

FORMAT_VERSION = 1
VERSION_FILE = "FORMAT"
VERSION_LINE = f"durable-streams-py data format {FORMAT_VERSION}\n"


class LayoutError(Exception):
    """The data directory holds something this server must not touch."""


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.meta = root / "meta"
        self.wal = root / "wal"
        self.segments = root / "segments"

    def segment_path(self, stream_id: int) -> Path:
        return self.segments / f"{stream_id & 0xFF:02x}" / f"{stream_id:016x}.log"

    def prepare(self) -> None:
        """Create a fresh layout, or check that an existing one is ours and current."""
        self.root.mkdir(parents=True, exist_ok=True)
        version_file = self.root / VERSION_FILE
        if version_file.exists():
            text = version_file.read_text(errors="replace")
            if text != VERSION_LINE:
                raise LayoutError(
                    f"{self.root}: data format {text.strip()!r} is not supported by this "
                    f"server (it reads {VERSION_LINE.strip()!r}); refusing to start"
                )
        else:
            unknown = [p.name for p in self.root.iterdir() if not p.name.startswith(".")]
            if unknown:
                raise LayoutError(
                    f"{self.root}: not empty and has no {VERSION_FILE} file "
                    f"(found {sorted(unknown)[:5]}); refusing to use it as a data directory"
                )
            tmp = self.root / (VERSION_FILE + ".tmp")
            tmp.write_text(VERSION_LINE)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            tmp.rename(version_file)
        for d in (self.meta, self.wal, self.segments):
            d.mkdir(exist_ok=True)
        fsync_dir(self.root)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
