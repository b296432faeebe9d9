"""The cost of retention to append throughput, and the disk it keeps, in one run.

    python e2e/bench/retention.py                     # 3 rounds of 10 s each way
    python e2e/bench/retention.py --rounds 5 --seconds 6 --bound-kib 1024

Issue 17 asks for the before/after of a ``max-bytes`` policy on appends. On
a shared machine throughput drifts by more than that cost within minutes, so
both sides run in the same process, alternating: each round starts our
server twice in fresh data directories, once with no policy and once with
``--retention 'bench/:max-bytes=<bound>'``, and sends the same wrk load
(64 connections, 1 KiB appends over a few streams under ``bench/``; with
the default 256 KiB bound the streams pass it within the first second, so
the policy trims all along). The medians of the rounds and their ratio are printed.

While wrk runs, the allocated bytes (``st_blocks * 512``: punched holes give
space back, the file's length does not shrink) of every segment file in the
data directory are sampled every second: the disk use over time, the
largest stream against the bound, with and without the policy.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the bench package and testkit
    sys.path[0:1] = [str(Path(__file__).resolve().parents[i]) for i in (1, 2)]

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from bench import log
from bench.client import create_streams, wrk
from bench.machine import raise_fd_limit
from bench.servers import ROOT, Server, missing

KiB = 1024
PREFIX = "bench/"


class PolicyServer(Server):
    """Our server with extra command-line arguments (the retention policy)."""

    def __init__(self, workdir: Path, extra: list[str]) -> None:
        super().__init__("ours", workdir, source=ROOT / "server")
        self.extra = extra

    def command(self) -> list[str]:
        return [*super().command(), *self.extra]


def segment_bytes(data_dir: Path) -> list[int]:
    """Allocated bytes of each stream's segment file (one file per stream)."""
    sizes = []
    for path in (data_dir / "segments").glob("*/*.log"):
        with contextlib.suppress(OSError):  # a stream deleted under us
            sizes.append(os.stat(path).st_blocks * 512)
    return sizes


@dataclass
class Sample:
    second: int
    largest_stream_kib: float
    all_streams_kib: float


def sample_disk(data_dir: Path, stop: threading.Event, out: list[Sample]) -> None:
    """Every second until ``stop``: the largest segment file and their sum."""
    started = time.monotonic()
    n = 1
    while not stop.wait(max(0.0, started + n - time.monotonic())):
        sizes = segment_bytes(data_dir) or [0]
        out.append(Sample(n, max(sizes) / KiB, sum(sizes) / KiB))
        n += 1


@dataclass
class Side:
    """One side of the comparison: every round's throughput and disk samples."""

    policy: str
    rates: list[float] = field(default_factory=list)
    errors: int = 0
    samples: list[list[Sample]] = field(default_factory=list)  # per round

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def one_round(side: Side, extra: list[str], workdir: Path, args: argparse.Namespace) -> None:
    srv = PolicyServer(workdir, extra)
    names = [f"{PREFIX}{i}" for i in range(args.streams)]
    try:
        srv.start()
        create_streams(srv, names)
        assert srv.data_dir is not None
        stop, samples = threading.Event(), list[Sample]()
        sampler = threading.Thread(target=sample_disk, args=(srv.data_dir, stop, samples))
        sampler.start()
        try:
            st = wrk(
                srv,
                threads=1,
                connections=args.connections,
                seconds=args.seconds,
                prefix=PREFIX,
                streams=args.streams,
                size=args.size,
            )
        finally:
            stop.set()
            sampler.join()
        side.rates.append(st.rate)
        side.errors += st.errors
        side.samples.append(samples)
        peak = max((s.largest_stream_kib for s in samples), default=0.0)
        log(f"{side.policy}: {st.rate:,.0f} appends/s, largest stream {peak:,.0f} KiB")
    finally:
        srv.cleanup()


def report(sides: list[Side], bound_kib: int, args: argparse.Namespace) -> str:
    none, bounded = sides
    lines = [
        f"retention: {args.connections} connections, {args.size}-byte appends over "
        f"{args.streams} streams under {PREFIX}, {args.rounds} rounds of {args.seconds:g} s "
        f"each way, alternating",
        "",
        "| policy | appends/s per round | median appends/s | errors |",
        "| --- | --- | ---: | ---: |",
    ]
    for side in sides:
        rounds = ", ".join(f"{r:,.0f}" for r in side.rates)
        lines.append(f"| {side.policy} | {rounds} | {side.median:,.0f} | {side.errors} |")
    lines.append(f"| with/without | | {bounded.median / none.median:.2f}x | |")
    lines += [
        "",
        f"disk use over time (last round; allocated bytes of the segment files, "
        f"bound {bound_kib:,} KiB per stream):",
        "",
        "| s | largest stream, no policy (KiB) | largest stream, bounded (KiB) "
        "| all streams, bounded (KiB) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    a, b = none.samples[-1], bounded.samples[-1]
    for i in range(max(len(a), len(b))):
        cells = [
            f"{a[i].largest_stream_kib:,.0f}" if i < len(a) else "",
            f"{b[i].largest_stream_kib:,.0f}" if i < len(b) else "",
            f"{b[i].all_streams_kib:,.0f}" if i < len(b) else "",
        ]
        lines.append(f"| {i + 1} | {' | '.join(cells)} |")
    peak = max((s.largest_stream_kib for r in bounded.samples for s in r), default=0.0)
    lines.append("")
    lines.append(
        f"largest stream under the policy, over all rounds: {peak:,.0f} KiB "
        f"({peak / bound_kib:.2f}x the bound)"
    )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each running both sides")
    ap.add_argument("--seconds", type=float, default=10, help="seconds of wrk load per side")
    ap.add_argument("--streams", type=int, default=4, help=f"streams under {PREFIX}")
    ap.add_argument("--connections", type=int, default=64, help="wrk connections")
    ap.add_argument("--size", type=int, default=1024, help="bytes per append")
    ap.add_argument("--bound-kib", type=int, default=256, help="the policy's max-bytes, in KiB")
    ap.add_argument("--json", dest="json_out", help="also write every figure to this file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if lacking := missing(["ours"], wrk=True):
        for name, why in lacking.items():
            print(f"missing ({name}): {why}", file=sys.stderr)
        return 2
    raise_fd_limit()
    policy = f"{PREFIX}:max-bytes={args.bound_kib}KiB"
    sides = [Side("none"), Side(policy)]
    extras: list[list[str]] = [[], ["--retention", policy]]
    with tempfile.TemporaryDirectory(prefix="ds-retention-") as tmp:
        for n in range(args.rounds):
            for side, extra in zip(sides, extras, strict=True):
                log(f"round {n + 1}: {side.policy}")
                one_round(side, extra, Path(tmp), args)
    print(report(sides, args.bound_kib, args))
    if args.json_out:
        doc = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "bound_kib": args.bound_kib,
            "ratio": sides[1].median / sides[0].median,
            "sides": [asdict(s) | {"median": s.median} for s in sides],
        }
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if any(s.errors for s in sides) else 0


if __name__ == "__main__":
    raise SystemExit(main())
