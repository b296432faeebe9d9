"""Recover a data directory in place, as a server start would, then stop.

Used to make a VolumeSnapshot clone of a live data directory readable.

A block-level snapshot of a live volume is a crash image. Acknowledged data
is in the WAL (flushed before every acknowledgement), but segment bytes and
LMDB pages written since the last checkpoint may still have been in the page
cache, so the image can hold tails that point past the bytes its segment
files have. Recovery, the same code a server runs at start, replays the WAL
into the segment files and LMDB and finishes with a checkpoint; afterwards
the clone reads like a cleanly stopped server's directory. It writes, so run
it on the writable clone (an init container): on a live server's directory it refuses,
exit status 2, as the directory's lock is held (engine/dir_lock.py).

    python -m stream_server.recover /data
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stream_server.engine import Engine, LayoutError, RecoveryReport
from stream_server.engine.dir_lock import DataDirInUse


def recover(data_dir: Path) -> RecoveryReport:
    """Recover ``data_dir`` in place, exactly as a server start would."""
    engine = Engine(data_dir)
    _, report = engine.open()
    engine.close()
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stream_server.recover", description=__doc__)
    p.add_argument("data_dir", type=Path)
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="exit 0 even if some streams failed their checksums",
    )
    args = p.parse_args(argv)
    if not args.data_dir.is_dir():
        print(f"{args.data_dir}: not a data directory (no such directory)", file=sys.stderr)
        return 2
    try:
        report = recover(args.data_dir)
    except (DataDirInUse, LayoutError) as exc:  # a live server's directory, or not ours
        print(f"{args.data_dir}: {exc}", file=sys.stderr)
        return 2
    print(
        f"{args.data_dir}: {report.streams} streams, {report.wal_frames_replayed} WAL frames "
        f"replayed, {report.truncated_bytes} unacknowledged bytes cut",
        file=sys.stderr,
    )
    if report.damaged:
        print(f"damaged streams (not readable): {report.damaged}", file=sys.stderr)
        return 0 if args.allow_damaged else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
