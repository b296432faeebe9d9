"""Figures the tests measure, printed once at the end of a ``make test`` run.

Under pytest-xdist the workers run the tests and the controller prints the
summary, so the lines go through a file rather than a list in memory. The
hooks that clear and print it are in the root ``conftest.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

LINES = Path(tempfile.gettempdir()) / "durable-streams-test-summary.txt"


def report(section: str, line: str) -> None:
    """Add ``line`` under ``section`` in the end-of-run summary."""
    with LINES.open("a") as out:
        out.write(f"{section}\t{line}\n")


def sections() -> dict[str, list[str]]:
    """Section -> its lines in the order reported, each once (two workers may both
    report the same image)."""
    out: dict[str, list[str]] = {}
    if LINES.exists():
        for raw in LINES.read_text().splitlines():
            section, _, line = raw.partition("\t")
            if line not in out.setdefault(section, []):
                out[section].append(line)
    return out


def clear() -> None:
    LINES.unlink(missing_ok=True)
