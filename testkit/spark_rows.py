"""Every stream of a data directory as the Spark reader reads it, for tests that
compare what the Spark reader sees with what the server serves."""

from __future__ import annotations

from pathlib import Path

from stream_spark._plan import Selection, batch_ranges, plan
from stream_spark._reader import MetaReader, read_slice


def every_stream(data_dir: Path) -> tuple[dict[str, list[bytes]], dict[str, bool]]:
    """Each stream's rows (stitched through forks), and which streams are JSON."""
    rows: dict[str, list[bytes]] = {}
    with MetaReader(data_dir) as meta:
        cut = meta.cut()
        is_json = {path: info.is_json for path, info in cut.streams.items()}
        for part in plan(cut, meta, batch_ranges(cut, Selection())):
            for sl in part:
                rows.setdefault(sl.stream, []).extend(
                    bytes(row.payload) for row in read_slice(data_dir, sl)
                )
    return rows, is_json
