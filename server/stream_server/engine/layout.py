"""The data directory's layout and its version file.

A server refuses a layout it does not understand rather than guessing: the
version file names the on-disk format (docs/storage-format.md).
"""

from __future__ import annotations

from pathlib import Path

from stream_server.engine import fsio

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
        fsio.mkdir(self.root)
        version_file = self.root / VERSION_FILE
        if version_file.exists():
            text = version_file.read_text(errors="replace")
            if text != VERSION_LINE:
                raise LayoutError(
                    f"{self.root}: data format {text.strip()!r} is not supported by this "
                    f"server (it reads {VERSION_LINE.strip()!r}); refusing to start"
                )
        else:
            # A crash during a first start can leave the version file's temporary
            # copy behind (its rename not yet durable): that start never finished.
            fsio.unlink(self.root / (VERSION_FILE + ".tmp"))
            unknown = [p.name for p in self.root.iterdir() if not p.name.startswith(".")]
            if unknown:
                raise LayoutError(
                    f"{self.root}: not empty and has no {VERSION_FILE} file "
                    f"(found {sorted(unknown)[:5]}); refusing to use it as a data directory"
                )
            fsio.write_durably(version_file, VERSION_LINE.encode())
        for d in (self.meta, self.wal, self.segments):
            fsio.mkdir(d)
        fsio.fsync_dir(self.root)
