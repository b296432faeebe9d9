"""Creating the data directory, or checking that an existing one is ours and current.

Paths and the version check live in the format package (``stream_format.layout``);
this is the writing half: a fresh directory gets its parts and a version file
written durably, and a server refuses a layout it does not understand.
"""

from __future__ import annotations

from stream_format.layout import VERSION_FILE, VERSION_LINE, FormatError, Layout
from stream_server.engine import fsio

LayoutError = FormatError  # the name the server's start-up reports


def prepare(layout: Layout) -> None:
    """Create a fresh layout, or check that an existing one is ours and current."""
    fsio.mkdir(layout.root)
    if layout.read_version() is not None:
        layout.check_version()
    else:
        # A crash during a first start can leave the version file's temporary
        # copy behind (its rename not yet durable): that start never finished.
        fsio.unlink(layout.root / (VERSION_FILE + ".tmp"))
        unknown = [p.name for p in layout.root.iterdir() if not p.name.startswith(".")]
        if unknown:
            raise LayoutError(
                f"{layout.root}: not empty and has no {VERSION_FILE} file "
                f"(found {sorted(unknown)[:5]}); refusing to use it as a data directory"
            )
        fsio.write_durably(layout.version_file, VERSION_LINE.encode())
    for d in (layout.meta, layout.wal, layout.segments):
        fsio.mkdir(d)
    fsio.fsync_dir(layout.root)
