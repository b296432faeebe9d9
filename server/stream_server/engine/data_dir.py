"""Creating the data directory, or checking that an existing one is ours and current.

Paths and the version check live in the format package (``stream_format.layout``);
this is the writing half: a fresh directory gets its parts and a version file
written durably, a server refuses a layout it does not understand (the WAL
files' headers included, so that it says so before it starts), and an older
format it can write is raised to the current one once recovery has emptied
its WAL (``upgrade``).
"""

from __future__ import annotations

import logging

from stream_format import wal as walmod
from stream_format.layout import (
    CURRENT,
    SET_ID_FILE,
    VERSION_FILE,
    DataFormat,
    FormatError,
    Layout,
    valid_set_id,
)
from stream_server.engine import fsio, wal_keep

LayoutError = FormatError  # the name the server's start-up reports

log = logging.getLogger("stream_server.engine")


def prepare(layout: Layout) -> DataFormat:
    """Create a fresh layout, or check that an existing one is a format this program
    writes and that its WAL files are ones recovery can replay; returns its format."""
    fsio.mkdir(layout.root)
    # A crash during a first start, or during an upgrade, can leave the version
    # file's temporary copy behind (its rename not yet durable): that write never
    # finished, and the next one starts afresh.
    fsio.unlink(layout.root / (VERSION_FILE + ".tmp"))
    fsio.unlink(layout.root / (SET_ID_FILE + ".tmp"))  # the same for the set id
    if layout.read_version() is not None:
        found = layout.check_version(write=True)
    else:
        unknown = [p.name for p in layout.root.iterdir() if not p.name.startswith(".")]
        if unknown:
            raise LayoutError(
                f"{layout.root}: not empty and has no {VERSION_FILE} file "
                f"(found {sorted(unknown)[:5]}); refusing to use it as a data directory"
            )
        fsio.write_durably(layout.version_file, CURRENT.text().encode())
        found = CURRENT
    for d in (layout.meta, layout.wal, layout.segments):
        fsio.mkdir(d)
    fsio.fsync_dir(layout.root)
    for path in walmod.wal_files(layout.wal):
        walmod.check_file(path, headerless=wal_headerless(found))
    layout.read_set_id()  # a damaged set id refuses the start here, as FORMAT does
    return found


def wal_headerless(found: DataFormat) -> bool:
    """Format 1's WAL files have no header."""
    return found.write < 2


def retire_wal(layout: Layout, found: DataFormat, keep: bool | None = None) -> int:
    """Delete the WAL files recovery has replayed (``keep``: move them into the
    archive's spool, which still needs a frame of theirs; None: there is no archive,
    and the spool goes too), raise an older format to the current one, and return
    the number of the next WAL file (``wal_keep.py``)."""
    old = walmod.wal_files(layout.wal)
    number = wal_keep.next_file_number(layout)
    wal_keep.retire(layout, old, bool(keep) and found == CURRENT)
    if keep is None:
        wal_keep.remove_spool(layout)
    if found != CURRENT:
        # The old format's WAL files must be gone for good (``retire`` flushed the
        # directory) before the version file says the directory is of the new format.
        upgrade(layout, found)
        log.info("data format %d raised to %d", found.write, CURRENT.write)
    return number


def upgrade(layout: Layout, found: DataFormat) -> None:
    """Raise the version file to the current format, once the WAL is empty.

    Called after recovery deleted the old WAL files and flushed the WAL
    directory: until the new version file is durable, the directory is still
    a valid directory of its old format (an older server may open it); after,
    it holds no file of the old format that the new one reads differently.
    """
    if found == CURRENT:
        return
    assert found.write < CURRENT.write, found
    assert not walmod.wal_files(layout.wal), "upgrade with a WAL to replay"
    fsio.write_durably(layout.version_file, CURRENT.text().encode())


def write_set_id(layout: Layout, set_id: str) -> None:
    """Record the replica set this directory belongs to, as the version file is
    written: a temporary file, flushed, renamed over the old one, the directory
    flushed (docs/storage-format.md). A crash leaves the old file or the new one."""
    if not valid_set_id(set_id):
        raise ValueError(f"{set_id!r} is not a replica set id")
    fsio.write_durably(layout.set_id_file, (set_id + "\n").encode())


def remove_set_id(layout: Layout) -> None:
    """Forget the set id (one this replica minted for a Lease it then failed to create)."""
    fsio.unlink(layout.set_id_file)
    fsio.fsync_dir(layout.root)
