"""The writer's instructions per append, counted by callgrind: a figure noise cannot move.

    python e2e/bench/writer_instructions.py                  # this checkout
    python e2e/bench/writer_instructions.py --baseline REF   # and the server at REF, side by side
    python e2e/bench/writer_instructions.py --per-frame 128  # batches of 128 instead of 32
    python e2e/bench/writer_instructions.py --split          # per append and per batch, from 32 and 128

The serial part of ``--workers N`` is the writer's cost per append (issue 28). Its
CPU time moves by a third between runs on this shared machine (docs/performance.md),
so a change of a tenth cannot be told from noise there. Instructions counted by
valgrind's callgrind are the same for the same program and input whatever else the
machine does. This counts them on the real store in a temporary directory: frames of
``--per-frame`` (32) 100-byte appends over 64 streams, fed to a ``WriterHost``'s link
as a worker's frames arrive (the frame's bytes, which the writer unpickles; it
pickles the answers), each once the last is answered: every batch is one frame, so
the count does not depend on how threads happened to interleave (the workers workload
prints the requests per batch of its 64 x 64 run: about as many). Two runs of
different lengths are counted; their difference per append is the steady cost,
without the start's. Both are one process: callgrind's count of the first frames is
dumped (and zeroed) when they are answered, and the rest's when they are, so the
second dump is the difference, and valgrind runs the start (its imports, the store's
opening: most of its CPU) once. Counted at two batch sizes (``--split``: 32 and 128), ``a + b/n``
splits what an append costs (``a``) from what a batch of ``n`` costs (``b``). Up to
64 appends a frame, each goes to a stream of its own, so a batch's cost is also its
streams'.

What it counts: user-space instructions of the writer's event loop (the main thread)
and of its other threads (the commit thread, mostly), from the first frame to the last
answer, with the collector set as the server sets it. The worker's side (pickling the
frames, reading the answers) is done outside the count: before it, and after callgrind
has dumped it. What it does not count: the kernel's
work (the fdatasyncs, the segment writes) and the socket between the processes, which
callgrind does not see; the workers workload's CPU figures include them.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the bench package and testkit
    sys.path[0:1] = [str(Path(__file__).resolve().parents[i]) for i in (1, 2)]

import argparse
import asyncio
import gc
import os
import pickle
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from bench import log
from bench.servers import ROOT, baseline_checkout
from testkit.servers import env_with

STREAMS = 64
PER_FRAME = 32  # appends per frame, and per batch: each frame waits for the last's answers
BODY = b"x" * 100
BIN = "application/octet-stream"
SHORT, LONG = 4_800, 14_400  # appends in the two counted runs
THREAD_FILE = re.compile(r"-(\d+)$")  # callgrind's file of thread N: <name>-NN


@dataclass(frozen=True)
class Counted:
    """Instructions per append of the writer's event loop and of its other threads."""

    loop: float
    others: float

    @property
    def total(self) -> float:
        return self.loop + self.others


# ------------------------------------------------------------------ the feed


def feed(phases: list[int], per_frame: int) -> None:
    """Run in the counted process: frames of ``per_frame`` appends through a link
    handler, ``phases[-1]`` in all, saying "done" (and waiting for a line) after the
    ``phases[i]``-th of each."""
    asyncio.run(_feed(phases, per_frame))


async def _feed(phases: list[int], per_frame: int) -> None:
    from stream_server.server import GC_THRESHOLDS  # where --baseline's older ones have it
    from stream_server.workers.host import HostLink
    from stream_server.workers.link import HEADER, PROTOCOL
    from testkit.asgi import in_process

    with tempfile.TemporaryDirectory(prefix="ds-instructions-") as where:
        async with in_process(Path(where)) as srv:
            app, client = srv.app, srv.client
            assert client is not None
            for i in range(STREAMS):
                r = await client.put(f"/v1/stream/s{i}", headers={"Content-Type": BIN})
                r.raise_for_status()
            link = HostLink(_writer_host(app))
            answered = asyncio.Event()
            replies: list[bytes] = []  # each frame of answers, as the writer sent it

            class Sink(asyncio.Transport):
                """The worker's end of the socket: keeps each frame of answers, unread
                (reading them is the worker's work, not the writer's)."""

                def is_closing(self) -> bool:
                    return False

                def writelines(self, parts: Any) -> None:
                    replies.append(parts[1])  # the length, then the pickled answers
                    answered.set()

            link.transport = Sink()
            # The worker's frames, made before the count: pickling them is its work.
            rid = 0
            sent: list[bytes] = []
            frames = phases[-1]
            for _ in range(frames):
                messages = []
                for _ in range(per_frame):
                    rid += 1
                    path = f"s{rid % STREAMS}"
                    messages.append((rid, "append", (path, BIN, BODY, None, None, False, None)))
                data = pickle.dumps(messages, PROTOCOL)
                sent.append(HEADER.pack(len(data)) + data)
            # The collector as the server runs it (``serve``): its thresholds, and what
            # the start built frozen; CPython's defaults would count full collections
            # over every object of the process that the server never runs.
            gc.set_threshold(*GC_THRESHOLDS)
            gc.freeze()
            # Counted from here to "done": the parent turns callgrind's instrumentation
            # on and off (the start, run uninstrumented, takes a fifth of the time it
            # would counted). One frame at a time, each answered in one frame.
            print("ready", flush=True)
            sys.stdin.readline()
            for n, frame in enumerate(sent, 1):
                link.data_received(frame)
                while len(replies) < n:  # a frame's appends are answered in one frame
                    answered.clear()
                    await answered.wait()
                if n in phases:
                    print("done", flush=True)
                    sys.stdin.readline()
            answers = [a for reply in replies for a in pickle.loads(reply)]
            refused = [(rid, value) for rid, ok, value in answers if not ok]
            if refused or len(answers) != frames * per_frame:
                raise RuntimeError(f"{len(answers)} answers, refused: {refused[:3]!r}")


def _writer_host(app: Any) -> Any:
    """The writer's side of the links over ``app``, as the counted server makes it:
    ``writer_host`` where it has one, by hand in one from before it (a ``--baseline``
    such as d326dbf)."""
    try:
        from stream_server.workers.processes import writer_host
    except ImportError:
        from stream_server.workers.host import WriterHost

        parts = ("store", "store_refusal", "store_clear", "reads_clear", "limiter", "reader_slots")
        return WriterHost(*(getattr(app, part) for part in parts))
    return writer_host(app)


# ------------------------------------------------------------------ counting


def count(
    source: Path | None,
    workdir: Path,
    per_frame: int = PER_FRAME,
    lengths: tuple[int, int] = (SHORT, LONG),
) -> Counted:
    """The two lengths of run under callgrind, as one run dumped at each (the module's
    docstring), counted from when its store is ready, and their difference; ``source``:
    the ``server/`` folder to count instead of this checkout's; ``lengths``: the appends
    of each."""
    short_frames, long_frames = (n // per_frame for n in lengths)
    if not 0 < short_frames < long_frames:
        raise ValueError(
            f"two lengths of run, the first shorter, of {per_frame} or more: {lengths}"
        )
    where = workdir / "run"
    where.mkdir(parents=True)
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        "--instr-atstart=no",
        f"--callgrind-out-file={where}/cg.%p",
        sys.executable,
        str(Path(__file__).resolve()),
        "--feed",
        f"{short_frames},{long_frames}",
        "--per-frame",
        str(per_frame),
    ]
    with (where / "stderr").open("w") as err:
        proc = subprocess.Popen(
            cmd,
            env=env_with(pythonpath=source),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        _expect(proc, "ready", where)
        _callgrind(proc.pid, "-i", "on")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        for _ in range(2):  # the short run's count, then the rest's
            _expect(proc, "done", where)
            _callgrind(proc.pid, "-d")  # dumped and zeroed: see thread_totals
            proc.stdin.write("go\n")
            proc.stdin.flush()
        proc.stdin.close()
        if proc.wait() != 0:
            raise RuntimeError(f"the feed failed: {_failure(where)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rest = thread_totals(where, dump=2)
    appends = (long_frames - short_frames) * per_frame
    return Counted(rest[1] / appends, (sum(rest.values()) - rest[1]) / appends)


def _expect(proc: subprocess.Popen[str], line: str, where: Path) -> None:
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != line:
        proc.wait()
        raise RuntimeError(f"the feed failed before {line!r}: {_failure(where)}")


def _callgrind(pid: int, *command: str) -> None:
    subprocess.run(
        ["callgrind_control", *command, str(pid)], check=True, timeout=120, capture_output=True
    )


def _failure(where: Path) -> str:
    return (where / "stderr").read_text(errors="replace")[-2000:]


def thread_totals(where: Path, dump: int = 1) -> dict[int, int]:
    """Instructions of each thread of the run in ``where`` (thread 1: the main one), as
    its ``dump``-th dump has them (``cg.<pid>.<dump>-<thread>``: what the run did since
    the dump before): what followed the last (the answers read and checked, the stop)
    is not the writer's work."""
    totals: dict[int, int] = {}
    for path in where.glob(f"cg.*.{dump}-*"):
        m = THREAD_FILE.search(path.name)
        thread = int(m.group(1)) if m else 1
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                totals[thread] = int(line.split()[1])
                break
    if 1 not in totals:
        raise RuntimeError(f"callgrind wrote no count of the main thread in {where}")
    return totals


def report(ours: Counted, base: Counted | None, ref: str | None) -> str:
    head = f"{'instructions per append':<32}{'ours':>12}"
    if base is not None:
        head += f"{'base ' + str(ref):>16}{'ours/base':>11}"
    lines = [head]
    for label, attr in (
        ("the writer's event loop", "loop"),
        ("its other threads (commit)", "others"),
        ("the writer, all threads", "total"),
    ):
        row = f"{label:<32}{getattr(ours, attr):>12,.0f}"
        if base is not None:
            b = getattr(base, attr)
            row += f"{b:>16,.0f}{getattr(ours, attr) / b:>10.2f}x"
        lines.append(row)
    return "\n".join(lines)


SPLIT = (32, 128)  # the two batch sizes of ``--split``


def split(small: Counted, large: Counted, sizes: tuple[int, int] = SPLIT) -> str:
    """Each thread's cost per append (``a``) and per batch (``b``), from counts at two
    batch sizes ``n``: ``a + b/n`` per append at each."""
    n1, n2 = sizes
    lines = [f"{'instructions':<32}{'per append':>12}{'per batch':>12}"]
    for label, attr in (
        ("the writer's event loop", "loop"),
        ("its other threads (commit)", "others"),
        ("the writer, all threads", "total"),
    ):
        c1, c2 = getattr(small, attr), getattr(large, attr)
        b = (c1 - c2) / (1 / n1 - 1 / n2)
        lines.append(f"{label:<32}{c1 - b / n1:>12,.0f}{b:>12,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", metavar="REF", help="also count the server at this ref")
    parser.add_argument(
        "--per-frame",
        type=int,
        default=PER_FRAME,
        metavar="N",
        help=f"appends per frame, and so per batch (default {PER_FRAME}): two counts at "
        "different N split the cost per append from the cost per batch",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help=f"count this checkout at {SPLIT[0]} and {SPLIT[1]} a batch and print each "
        "thread's cost per append and per batch",
    )
    parser.add_argument("--feed", metavar="FRAMES,FRAMES", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.feed is not None:
        feed([int(n) for n in args.feed.split(",")], args.per_frame)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is missing (make deps installs it)", file=sys.stderr)
        return 2
    if args.split:
        with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
            log(f"counting this checkout's writer at {SPLIT[0]} and {SPLIT[1]} a batch")
            small, large = (count(None, Path(tmp) / f"n{n}", n) for n in SPLIT)
        print(f"over {STREAMS} streams, from batches of {SPLIT[0]} and {SPLIT[1]}")
        print(split(small, large))
        return 0
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        log("counting this checkout's writer (under callgrind, about a minute)")
        ours = count(None, Path(tmp) / "ours", args.per_frame)
        base = None
        with baseline_checkout(args.baseline, Path(tmp)) as source:
            if source is not None:
                log(f"counting the writer at {args.baseline}")
                base = count(source, Path(tmp) / "base", args.per_frame)
    print(f"{args.per_frame} appends per frame and per batch, over {STREAMS} streams")
    print(report(ours, base, args.baseline))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
