"""testkit.cpu_timeline: what it writes per test is summed per module, CPU first."""

from __future__ import annotations

from types import SimpleNamespace

from testkit.cpu_timeline import by_module, main, runs_tests

LINES = [
    "gw0\t100.0\t104.0\t1.50\t2.00\ttests/a/test_x.py::test_one\n",
    "gw1\t100.0\t101.0\t0.25\t0.00\ttests/a/test_x.py::test_two[p]\n",
    "gw0\t104.0\t114.0\t9.00\t0.00\ttests/test_y.py::test_three\n",
]


def test_tests_are_summed_per_module():
    modules = by_module(LINES)
    x, y = modules["tests/a/test_x.py"], modules["tests/test_y.py"]
    assert (x.wall, x.own, x.children, x.tests, x.cpu) == (5.0, 1.75, 2.0, 2, 3.75)
    assert (y.wall, y.cpu, y.tests) == (10.0, 9.0, 1)


def test_the_modules_are_printed_most_cpu_first(tmp_path, capsys):
    path = tmp_path / "t.tsv"
    path.write_text("".join(LINES))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 modules, 0.2 CPU minutes"
    assert out[2].endswith("tests/test_y.py") and out[3].endswith("tests/a/test_x.py")


def test_an_xdist_controller_records_nothing_its_workers_and_a_plain_run_do():
    def config(numprocesses: int | None, worker: bool) -> SimpleNamespace:
        c = SimpleNamespace(option=SimpleNamespace(numprocesses=numprocesses))
        if worker:
            c.workerinput = {}
        return c

    assert not runs_tests(config(2, worker=False))  # type: ignore[arg-type]
    assert runs_tests(config(2, worker=True))  # type: ignore[arg-type]
    assert runs_tests(config(None, worker=False))  # type: ignore[arg-type]
