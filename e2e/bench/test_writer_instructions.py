"""The writer's instruction count (``writer_instructions.py``): the counted feed runs on
the real store under callgrind, and each thread's count is read from callgrind's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.writer_instructions import Counted, count, report, thread_totals

pytestmark = pytest.mark.processes


def test_a_short_count_of_this_checkout_gives_each_threads_instructions_per_append(
    tmp_path: Path,
) -> None:
    counted = count(None, tmp_path, lengths=(128, 384))
    # An append costs the event loop tens of thousands of instructions (a parse, checks,
    # a commit action, an answer); the commit thread frames, writes and commits it.
    assert 5_000 < counted.loop < 500_000, counted
    assert 1_000 < counted.others < 500_000, counted
    table = report(counted, Counted(counted.loop * 2, counted.others * 2), "REF")
    assert "0.50x" in table and "base REF" in table, table


def test_a_run_without_the_main_threads_count_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "cg.123.1-02").write_text("events: Ir\nsummary: 500\n")
    with pytest.raises(RuntimeError, match="main thread"):
        thread_totals(tmp_path)
    (tmp_path / "cg.123.1-01").write_text("events: Ir\nsummary: 1500\n")
    (tmp_path / "cg.123-01").write_text("events: Ir\nsummary: 9000\n")  # after the dump
    assert thread_totals(tmp_path) == {1: 1500, 2: 500}
