"""The garbage collector's pauses during a fill of many streams, in process: CPython's
default thresholds beside the server's (``stream_server.serving.GC_THRESHOLDS``).

    python e2e/bench/gc_pauses.py            # 100,000 streams: creates, then one append each
    python e2e/bench/gc_pauses.py 20000

A full collection walks every tracked object while the event loop (and every append
waiting on it) stands still; the line per setting gives how many full collections the
fill ran, the longest, and the longest young-generation pause.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0:1] = [str(Path(__file__).resolve().parents[2] / "server")]

import asyncio
import gc
import tempfile
import time

from stream_server.serving import GC_THRESHOLDS
from stream_server.streams.store import AppendRequest, CreateRequest, StreamStore

BIN = "application/octet-stream"


async def fill(data: Path, n: int) -> None:
    store = StreamStore(data)
    await store.start()
    for i in range(0, n, 500):
        batch = range(i, min(n, i + 500))
        await asyncio.gather(*(store.create(CreateRequest(f"c/{j}", BIN)) for j in batch))
    for i in range(0, n, 64):
        batch = range(i, min(n, i + 64))
        await asyncio.gather(
            *(store.append(AppendRequest(f"c/{j}", BIN, b"a" * 100)) for j in batch)
        )
    await store.stop()


def measure(thresholds: tuple[int, int, int], n: int) -> tuple[int, float, float, float]:
    """Full collections, the longest full one (s), the longest young one (s), the fill's
    seconds."""
    pauses: list[tuple[int, float]] = []
    began = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - began[0]))

    old = gc.get_threshold()
    gc.set_threshold(*thresholds)
    gc.callbacks.append(timed)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(fill(Path(tmp), n))
    finally:
        gc.callbacks.remove(timed)
        gc.set_threshold(*old)
    full = [p for g, p in pauses if g == 2]
    young = [p for g, p in pauses if g < 2]
    return len(full), max(full, default=0.0), max(young, default=0.0), time.perf_counter() - started


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    for name, thresholds in (
        ("CPython's defaults", (700, 10, 10)),
        ("the server's", GC_THRESHOLDS),
    ):
        count, longest, young, seconds = measure(thresholds, n)
        print(
            f"{n:,} streams, {name} {thresholds}: {count} full collections, longest "
            f"{longest * 1000:.0f} ms; longest young {young * 1000:.1f} ms; fill {seconds:.1f} s"
        )


if __name__ == "__main__":
    main()
