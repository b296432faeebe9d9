"""start_cpu measures a real server's start: a figure that only a real start can give."""

from __future__ import annotations

import pytest
from start_cpu import main

pytestmark = pytest.mark.processes


def test_one_start_prints_a_positive_cpu_figure(capsys):
    assert main(["--runs", "1"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("server start to serving: 1 runs, CPU min ")
    assert float(line.split("min ")[1].split(" s")[0]) > 0


def test_a_bad_setting_stops_the_measure_with_the_servers_refusal():
    with pytest.raises(SystemExit, match="exited before serving"):
        main(["--runs", "1", "--", "--port", "-5"])
