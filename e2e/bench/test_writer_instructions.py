"""The writer's instruction count (``writer_instructions.py``): the counted feed runs on
the real store under callgrind, and each thread's count is read from callgrind's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.writer_instructions import Counted, count, report, split, thread_totals

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


def test_the_split_gives_back_the_cost_per_append_and_per_batch() -> None:
    """Counts made of a known ``a + b/n`` at 32 and 128 a batch give ``a`` and ``b`` back."""
    loop, commit = (40_000, 256_000), (20_000, 640_000)  # (per append, per batch)

    def at(n: int) -> Counted:
        return Counted(loop[0] + loop[1] / n, commit[0] + commit[1] / n)

    table = split(at(32), at(128))
    assert "the writer's event loop" in table and "40,000" in table and "256,000" in table
    assert "20,000" in table and "640,000" in table
    assert "60,000" in table and "896,000" in table  # the whole writer
