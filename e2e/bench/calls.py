"""Python calls the server's event loop makes per append: ours, and ours at a git ref.

    python e2e/bench/calls.py --baseline 06984cc
    python e2e/bench/calls.py --baseline 06984cc --archive   # ours archiving to SeaweedFS

Throughput on a shared 2-core machine moves by several percent from one run
to the next; the number of Python function calls one append costs does not.
Each server runs under cProfile (which sees the event loop's thread, not the
writer thread's fsyncs) while wrk sends 64 connections of 100-byte appends
over 64 streams; the calls are divided by the requests answered. A change to
the append path that adds work shows here even when the benchmark's noise
hides it.
"""

from __future__ import annotations

import argparse
import contextlib
import pstats
import signal
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # run as a script: the bench package and the testkit
    sys.path[0:1] = [str(Path(__file__).resolve().parents[i]) for i in (1, 2)]

from bench.client import create_streams, wrk
from bench.servers import ROOT, Server, baseline_checkout
from testkit.seaweedfs import SeaweedFS

STREAMS = 64


class ProfiledServer(Server):
    """Our server under cProfile, writing its profile to ``out`` when it stops."""

    def __init__(self, kind: str, workdir: Path, source: Path, out: Path) -> None:
        super().__init__(kind, workdir, source=source)
        self.out = out

    def command(self) -> list[str]:
        python, *rest = super().command()  # python -m stream_server serve ...
        # One process that serves: with worker processes (one per CPU by default)
        # the requests would be answered outside the profile.
        return [python, "-m", "cProfile", "-o", str(self.out), *rest, "--workers", "1"]

    def stop(self) -> None:
        # SIGINT: uvicorn stops, the interpreter unwinds and cProfile writes its file
        # (after SIGTERM uvicorn re-raises the signal and nothing is written).
        if self.child and self.child.proc and self.child.proc.poll() is None:
            self.child.proc.send_signal(signal.SIGINT)
            self.child.proc.wait(timeout=60)


def profiled_run(
    source: Path, workdir: Path, kind: str, seconds: float, archive: SeaweedFS | None
) -> tuple[int, int]:
    """(Python calls, requests answered) of one server's whole life: start, create
    the streams, ``seconds`` of appends (none with 0), stop; archiving to a new bucket
    of ``archive`` when given."""
    out = workdir / f"{kind}-{seconds:g}.prof"
    srv = ProfiledServer(kind, workdir, source, out)
    if archive is not None:
        url = archive.new_bucket()
        srv.extra_args = ["--archive-url", url, "--archive-endpoint", archive.endpoint]
        srv.extra_env = {k: v for k, v in archive.env().items() if k.startswith("AWS_")}
    srv.start()
    try:
        create_streams(srv, [f"c{i}" for i in range(STREAMS)])
        if seconds:
            wrk(srv, threads=1, connections=64, seconds=seconds, prefix="c", streams=STREAMS)
    finally:
        srv.stop()
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    answered = sum(v[1] for (_, _, name), v in stats.items() if name == "on_response_complete")
    return sum(v[1] for v in stats.values()), answered


def calls_per_append(
    source: Path, workdir: Path, kind: str, seconds: float, archive: SeaweedFS | None = None
) -> float:
    """The calls the appends added, per append: a life with load less one without
    (start-up, imports, creates and shutdown cancel out)."""
    idle_calls, idle_answered = profiled_run(source, workdir, kind, 0, archive)
    calls, answered = profiled_run(source, workdir, kind, seconds, archive)
    if answered <= idle_answered:
        raise SystemExit(f"{kind}: no append was answered in the profiled process")
    return (calls - idle_calls) / (answered - idle_answered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="the git ref to compare with")
    parser.add_argument("--seconds", type=float, default=6.0, help="of load per server")
    parser.add_argument(
        "--archive",
        action="store_true",
        help="ours archives to a real SeaweedFS (the baseline runs as it is)",
    )
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="calls-") as tmp,
        baseline_checkout(args.baseline, Path(tmp)) as base,
        contextlib.ExitStack() as stack,
    ):
        assert base is not None
        archive = None
        if args.archive:
            archive = SeaweedFS(Path(tmp) / "seaweedfs")
            stack.callback(archive.close)
            archive.start()
        ours = calls_per_append(ROOT / "server", Path(tmp), "ours", args.seconds, archive)
        theirs = calls_per_append(base, Path(tmp), "baseline", args.seconds)
    print("| server | Python calls per append (event loop) |")
    print("|---|---|")
    print(f"| ours{' (archiving)' if args.archive else ''} | {ours:.1f} |")
    print(f"| base {args.baseline} | {theirs:.1f} |")
    print(f"| ours/base | {ours / theirs:.3f}x |")


if __name__ == "__main__":
    main()
