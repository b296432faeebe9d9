"""``python -m testkit.simulate --seeds N [--seed S] [--mutant NAME] [--without FAULT]
[--list-mutants]``.

Runs seeds S, S+1, ... S+N-1 (S defaults to 0), prints one line per seed that
shows a violation (the seed, the mutant, the first violation), then one line
with the count of seeds and violations (``--trace`` prints each seed's events
and their digest, to read what a failing seed did). With a mutant, violations are what is
wanted: the last line says whether it was caught, and the exit status is 0
only then. Healthy, the exit status is 0 only with no violation. ``--without``
(repeatable) leaves a kind of fault out, to see which faults a mutant needs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from testkit.simulate.mutants import MUTANTS
from testkit.simulate.run import run_seed
from testkit.simulate.workload import FAULTS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.simulate", description=__doc__)
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds to run")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--mutant", choices=sorted(MUTANTS), help="break this rule")
    parser.add_argument("--first", action="store_true", help="stop at the first failing seed")
    parser.add_argument("--trace", action="store_true", help="print each seed's trace")
    parser.add_argument(
        "--in-order-lease-answers",
        action="store_true",
        help="a member's Lease answers come in the order of its requests (one connection)",
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        choices=list(FAULTS),
        metavar="FAULT",
        help="never throw this kind of fault (repeatable): " + ", ".join(FAULTS),
    )
    parser.add_argument("--list-mutants", action="store_true", help="list the mutants")
    args = parser.parse_args(argv)
    if args.list_mutants:
        for name, mutant in MUTANTS.items():
            print(f"{name}: {mutant.what}")
        return 0
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    started = time.perf_counter()
    failing = violations = runs = 0
    for seed in range(args.seed, args.seed + args.seeds):
        result = run_seed(
            seed, args.mutant, reorder=not args.in_order_lease_answers, without=args.without
        )
        runs += 1
        if args.trace:
            print("\n".join(result.trace), f"digest {result.digest}", sep="\n")
        if result.violations:
            failing += 1
            violations += len(result.violations)
            print(f"seed {seed} mutant {args.mutant or '-'}: {result.violations[0]}", flush=True)
            if args.first:
                break
    took = time.perf_counter() - started
    if args.mutant is None:
        verdict = "healthy" if not violations else f"{failing} failing seeds"
    else:
        verdict = f"mutant {args.mutant} " + ("caught" if violations else "NOT caught")
    print(f"simulate: {runs} seeds, {violations} violations ({verdict}) in {took:.1f} s")
    return 0 if (violations == 0) == (args.mutant is None) else 1


if __name__ == "__main__":
    sys.exit(main())
