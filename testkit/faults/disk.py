"""A disk that fills: a small real filesystem as one server's data directory.

``small_disk(where)`` mounts a tmpfs (or a loop-mounted ext4 image) of a few
megabytes at ``where`` and unmounts it on the way out, whatever happened;
``fill(where)`` takes all but a little of its space with a filler file and
``free(where)`` gives it back. Mount the disk at the data directory a
``ReplicaSet`` will use (``<data root>/<name>``) before the set starts. Needs
root; the ext4 kind needs ``mkfs.ext4`` (Debian's e2fsprogs).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

FILLER = ".fault-filler"  # in the data directory; the server never looks at it


@contextlib.contextmanager
def small_disk(
    where: Path, size_mb: int = 24, kind: Literal["tmpfs", "ext4"] = "tmpfs"
) -> Iterator[Path]:
    """A ``size_mb`` filesystem mounted at ``where`` (created if missing) while inside."""
    where.mkdir(parents=True, exist_ok=True)
    if kind == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)]
    else:
        image = where.with_name(where.name + ".img")
        subprocess.run(["truncate", "-s", f"{size_mb}M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
        cmd = ["mount", "-o", "loop", str(image), str(where)]
    mounted = subprocess.run(cmd, capture_output=True, text=True)
    if mounted.returncode != 0:
        raise RuntimeError(f"cannot mount a {kind} at {where}: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        # Lazy: a server killed a moment ago may still hold a file open.
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(where: Path, leave: int = 1024 * 1024) -> int:
    """Take all of ``where``'s free space but ``leave`` bytes; the bytes taken."""
    take = max(0, shutil.disk_usage(where).free - leave)
    with open(where / FILLER, "ab") as out:
        out.write(b"\0" * take)
        out.flush()
    return take


def free(where: Path) -> None:
    """Give back what ``fill`` took."""
    (where / FILLER).unlink(missing_ok=True)
