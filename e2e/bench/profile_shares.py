"""Where a thread's time goes, from a py-spy raw profile: the share of its samples per function.

    py-spy record --threads --subprocesses --format raw --rate 200 -o raw.txt -- \\
        python e2e/bench/run.py --servers ours --only appends_64x64
    python e2e/bench/profile_shares.py raw.txt --thread MainThread --within stream_server
    python e2e/bench/profile_shares.py raw.txt --thread '' --functions   # every thread

A frame is a function at a line: ``--functions`` counts a function once per
sample whatever line it was at (its whole inclusive share), rather than each
of its call sites apart.

Shares are inclusive (a function counts every sample where it is on the
stack) and relative to the samples of the chosen threads, optionally only
those whose stack passes through a frame matching ``--within`` (for example
``_long_poll`` for the wake-up path). The figures in docs/performance.md
and docs/performance-journal.md that cite a profile come from this script.
"""

from __future__ import annotations

import argparse
from collections import Counter


def shares(
    lines: list[str], thread: str, within: str | None, functions: bool = False
) -> tuple[int, Counter]:
    total = 0
    counts: Counter = Counter()
    for line in lines:
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        # With --subprocesses the stack starts with "process ..." frames, then the thread.
        at = next((i for i, f in enumerate(frames) if f.startswith("thread (")), None)
        if at is None or thread not in frames[at] or (within and within not in stack):
            continue
        total += int(n)
        for name in {_short(f, functions) for f in frames[at + 1 :]}:
            counts[name] += int(n)
    return total, counts


def _short(frame: str, functions: bool = False) -> str:
    """``func (/long/path/file.py:12)`` -> ``func (file.py:12)``, or with ``functions``
    ``func (file.py)``."""
    func, _, where = frame.partition(" (")
    if not where:
        return func
    where = where.rsplit("/", 1)[-1]
    if functions:
        where = where.split(":", 1)[0].rstrip(")") + ")"
    return f"{func} ({where}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="py-spy --format raw output")
    ap.add_argument("--thread", default="MainThread", help="thread name part (default MainThread)")
    ap.add_argument("--within", help="only samples whose stack has a frame containing this")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--functions", action="store_true", help="one share per function, all lines")
    args = ap.parse_args()
    with open(args.raw) as f:
        total, counts = shares(f.readlines(), args.thread, args.within, args.functions)
    print(
        f"{total} samples of thread {args.thread!r}"
        + (f" within {args.within!r}" if args.within else "")
    )
    for name, n in counts.most_common(args.top):
        print(f"{100 * n / max(total, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main()
