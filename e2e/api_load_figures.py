"""The figures behind "API load" in docs/kubernetes.md: the operator's API requests a
minute, by verb and resource, and its CPU, for N converged DurableStreams of one
replica and of three, in a steady state (testkit.api_load says how they are counted).

    python e2e/api_load_figures.py 100
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
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    logging.disable(logging.WARNING)
    for replicas in (1, 3):
        with cluster() as c:
            print(table(measure(c, count, replicas)), flush=True)


if __name__ == "__main__":
    main()
