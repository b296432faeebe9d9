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
    """Section -> its lines in the order reported, one per subject (a line's text before
    its first ": "), the first reported: two workers both report each image, the one
    that built it and the one that then found it unchanged."""
    out: dict[str, dict[str, str]] = {}
    if LINES.exists():
        for raw in LINES.read_text().splitlines():
            section, _, line = raw.partition("\t")
            out.setdefault(section, {}).setdefault(line.partition(": ")[0], line)
    return {section: list(lines.values()) for section, lines in out.items()}


def clear() -> None:
    LINES.unlink(missing_ok=True)
