"""The figures behind "API load" in docs/kubernetes.md: the operator's API requests a
minute, by verb and resource, and its CPU, for N converged DurableStreams of one
replica and of three, in a steady state (testkit.api_load says how they are counted).

    python e2e/api_load_figures.py 100             # the operator as it runs
    python e2e/api_load_figures.py 100 --no-cache  # without its watch-fed cache (before)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "server"), str(ROOT / "operator")]

from testkit.api_load import measure, table  # noqa: E402
from testkit.cluster import cluster  # noqa: E402


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--no-cache"]
    count = int(args[0]) if args else 100
    logging.disable(logging.WARNING)
    for replicas in (1, 3):
        with cluster() as c:
            figures = measure(c, count, replicas, cached="--no-cache" not in sys.argv)
            print(table(figures), flush=True)


if __name__ == "__main__":
    main()
