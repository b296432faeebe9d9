"""Catch-up read speed of the storage engine alone (no HTTP), in MiB/s.

    python e2e/bench/engine_read.py [--mib 100] [--record-bytes 1024]

Writes a stream of fixed-size records into a temporary data directory
through the engine, then reads it back from unit 0 in 4 MiB chunks, the way
a catch-up GET does, and prints the best of three runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from stream_format.records import KIND_BYTES
from stream_server.engine import Engine, StreamMeta
from stream_server.engine.ops import Append, CreateLog, PutStream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--record-bytes", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Path(tmp) / "data")
        engine.open()
        meta = StreamMeta(id=1, content_type="application/octet-stream", created_at=0.0)
        engine.commit([CreateLog(1, 0), PutStream("bench", meta)])
        record = b"x" * args.record_bytes
        per_batch = max(1, (4 << 20) // args.record_bytes)
        total = args.mib << 20
        for _ in range(0, total, per_batch * args.record_bytes):
            engine.commit([Append(1, KIND_BYTES, [record] * per_batch)])
        tail = engine.tails[1].unit
        best = 0.0
        for _ in range(3):
            started = time.perf_counter()
            unit, hint, n = 0, None, 0
            while unit < tail:
                payloads, unit, hint = engine.read(1, KIND_BYTES, unit, tail, 4 << 20, hint)
                n += len(b"".join(payloads))
            best = max(best, n / 2**20 / (time.perf_counter() - started))
        engine.close()
    print(
        f"engine catch-up read: {best:.0f} MiB/s ({tail / 2**20:.0f} MiB, "
        f"{args.record_bytes}-byte records)"
    )


if __name__ == "__main__":
    main()
