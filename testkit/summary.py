"""Figures the tests measure, printed once at the end of a ``make test`` run.

Under pytest-xdist the workers run the tests and the controller prints the
summary, so the lines go through a file rather than a list in memory: one file
per run, named in the environment the workers inherit, so two runs on one
machine keep theirs apart. The hooks that start, print and end it are in the
root ``conftest.py``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ENV = "TESTKIT_SUMMARY_FILE"  # not DS_*: the server refuses unknown DS_ settings


def start() -> None:
    """A fresh file for this run (the controller, before its workers start)."""
    fd, name = tempfile.mkstemp(prefix="durable-streams-test-summary-", suffix=".txt")
    os.close(fd)
    os.environ[ENV] = name


def end() -> None:
    if name := os.environ.pop(ENV, ""):
        Path(name).unlink(missing_ok=True)


def report(section: str, line: str) -> None:
    """Add ``line`` under ``section`` in the end-of-run summary (nothing outside a run
    that started one)."""
    if name := os.environ.get(ENV):
        with open(name, "a") as out:
            out.write(f"{section}\t{line}\n")


def sections() -> dict[str, list[str]]:
    """Section -> its lines in the order reported, one per subject (a line's text before
    its first ": "), the first reported: two workers both report each image, the one
    that built it and the one that then found it unchanged."""
    out: dict[str, dict[str, str]] = {}
    name = os.environ.get(ENV)
    if name and Path(name).exists():
        for raw in Path(name).read_text().splitlines():
            section, _, line = raw.partition("\t")
            out.setdefault(section, {}).setdefault(line.partition(": ")[0], line)
    return {section: list(lines.values()) for section, lines in out.items()}
